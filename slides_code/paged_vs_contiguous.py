"""Slide "连续预分配 vs 分页": the same KV capacity, measured on the same requests.

Contiguous pre-allocation is not simulated: with kvcache_block_size = max_model_len
every request takes exactly one max_model_len-sized block, which is what a
non-paged engine reserves.

    python -m slides_code.paged_vs_contiguous [--out DIR]   # writes paged_vs_contiguous.png
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

import random

from slides_code._common import figure_path, model_dir, out_dir, parse_args, setup_torch

MAX_LEN, CAPACITY = 256, 1024


def kv_usage(events, block_size) -> dict:
    """Steps, peak concurrency, and stored/allocated KV tokens per decode step, from a lifecycle log."""
    steps = [e for e in events if e["event"] == "STEP"]
    used = {}
    for e in events:      # tokens whose K/V are stored, per decode step
        if e["event"] == "SCHEDULED" and not e["is_prefill"]:
            used[e["step"]] = used.get(e["step"], 0) + e["num_cached_tokens"] + 1
    allocated = {e["step"]: e["kv_blocks_used"] * block_size for e in steps if not e["is_prefill"]}
    return {"steps": len(steps), "peak_running": max(e["num_running"] for e in steps),
            "utilization": sum(used.values()) / sum(allocated.values()), "used": used, "allocated": allocated}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv, __doc__.splitlines()[0])
    out = out_dir(args)
    setup_torch()
    from reference import LLM, SamplingParams
    rng = random.Random(0)
    work = [(rng.randint(16, 64), rng.randint(16, 96)) for _ in range(24)]
    prompts = [[rng.randrange(1000) for _ in range(n)] for n, _ in work]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for _, m in work]
    results = {}

    # --- slide: 同样 1024 个 token 的 KV cache，两种分配方式 ---
    for name, block_size in (("contiguous", MAX_LEN), ("paged", 16)):
        llm = LLM(model_dir(), device="auto", max_model_len=MAX_LEN, kvcache_block_size=block_size,
                  num_kvcache_blocks=CAPACITY // block_size, max_num_seqs=64, enable_prefix_caching=False)
        llm.generate(prompts, params, use_tqdm=False)
        results[name] = kv_usage(llm.log.events, block_size)     # from the STEP / SCHEDULED events
        print(f"{name:>10}: {results[name]['steps']} steps, up to {results[name]['peak_running']} requests at once, "
              f"KV utilization {results[name]['utilization']:.0%}")
    # --- end slide ---

    figure = figure_path(out, "paged_vs_contiguous.png")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for (name, r), color in zip(results.items(), ("#d62728", "#1f77b4")):
        ax.plot(list(r["allocated"]), list(r["allocated"].values()), color=color, label=f"{name}: allocated")
        ax.plot(list(r["used"]), list(r["used"].values()), color=color, linestyle="--", label=f"{name}: used")
    ax.axhline(CAPACITY, color="gray", linestyle=":", linewidth=1)
    ax.set(xlabel="engine step", ylabel="KV slots (tokens)", title="KV cache allocated vs used")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(figure, dpi=150)
    plt.close(fig)
    print(f"figure: {figure}")
    results["figure"] = str(figure)
    return results


if __name__ == "__main__":
    main()
