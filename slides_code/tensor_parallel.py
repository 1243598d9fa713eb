"""Slide "Tensor parallelism": split one MLP over two "ranks" by hand, then run the engine with TP=2.

The first listing is the whole idea on one process: gate/up split by columns
(each rank gets half the intermediate features), down split by rows, and the
all-reduce is a plain sum of the two partial outputs. The second runs the real
thing: `LLM(..., tensor_parallel_size=2)` starts a second process (gloo on the
CPU, NCCL on two GPUs) and must produce the single-process tokens.

    python -m slides_code.tensor_parallel
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

import torch

from slides_code._common import model_dir, parse_args, setup_torch


# --- slide: Column-parallel + row-parallel = 一次 all-reduce ---
def mlp(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def mlp_tp(x, gate, up, down, world=2):
    """Rank r holds rows r of gate/up (column-parallel) and columns r of down (row-parallel)."""
    partial = []
    for r in range(world):
        g, u = gate.chunk(world, dim=0)[r], up.chunk(world, dim=0)[r]   # [I/N, H]
        d = down.chunk(world, dim=1)[r]                                # [H, I/N]
        partial.append(mlp(x, g, u, d))                                # no communication so far
    return sum(partial)                                                # the all-reduce
# --- end slide ---


def main(argv: list[str] | None = None) -> dict:
    parse_args(argv, __doc__.splitlines()[0])
    setup_torch()
    gen = torch.Generator().manual_seed(0)
    hidden, inter = 64, 256
    x = torch.randn(8, hidden, generator=gen, dtype=torch.float64)
    gate, up = (torch.randn(inter, hidden, generator=gen, dtype=torch.float64) for _ in range(2))
    down = torch.randn(hidden, inter, generator=gen, dtype=torch.float64)
    max_diff = (mlp(x, gate, up, down) - mlp_tp(x, gate, up, down)).abs().max().item()
    print(f"one MLP vs two ranks + sum: max |difference| = {max_diff:.1e} (float64)")

    from reference import LLM, SamplingParams
    model = model_dir()
    prompts = [[1, 2, 3, 4, 5], list(range(100, 140))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    device = "cuda" if torch.cuda.device_count() >= 2 else "cpu"     # TP=2 needs two GPUs, or the CPU

    # --- slide: 引擎里的 TP：一个参数 ---
    single = LLM(model, device="auto", dtype="float32").generate(prompts, params, use_tqdm=False)
    tp = LLM(model, device=device, dtype="float32", tensor_parallel_size=2)   # starts rank 1
    attn = tp.model_runner.model.model.layers[0].self_attn
    print(f"rank 0 holds {attn.num_heads} query heads and {attn.num_kv_heads} KV heads per layer")
    same = [o["token_ids"] for o in tp.generate(prompts, params, use_tqdm=False)] == \
           [o["token_ids"] for o in single]
    print("TP=2 tokens equal to TP=1:", same)
    tp.model_runner.close()                                                   # stop rank 1
    # --- end slide ---

    cfg = tp.config.hf_config
    per_step = (2 * cfg["num_hidden_layers"] + 1) * cfg["hidden_size"] * 4
    print(f"all-reduced per decode step and sequence: {2 * cfg['num_hidden_layers'] + 1} calls, {per_step} bytes")
    return {"max_diff": max_diff, "tokens_equal": same, "heads": (attn.num_heads, attn.num_kv_heads),
            "workers_alive": [p.is_alive() for p in tp.model_runner.workers]}


if __name__ == "__main__":
    main()
