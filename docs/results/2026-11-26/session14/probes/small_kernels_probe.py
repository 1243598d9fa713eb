"""Session 14: three per-step kernels of a decode step, as they were and as they are now (one H100).

Each variant is launched 20 times inside one CUDA graph; µs per launch is the median of 15
replays over 20. Shapes are bench-256's: batch sizes the decode bands pass through, Qwen3-0.6B's
vocabulary (151,936) and head_dim 128, bf16 logits. The new kernels' answers are checked
against the old ones on the same inputs (token for token, bit for bit).

    python3 docs/results/2026-11-26/session14/probes/small_kernels_probe.py out.json
"""
from __future__ import annotations

import json
import sys

import torch

from reference.kernels.greedy_argmax import greedy_argmax
from reference.kernels.paged_decode import longest_first
from reference.models.qwen3 import RotaryEmbedding

REPEAT, ROUNDS = 20, 15


def graph_us(fn) -> float:
    fn()                                           # compile / warm up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPEAT):
            fn()
    times = []
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / REPEAT)
    return sorted(times)[len(times) // 2]


def frequencies(head_dim=128, base=1_000_000.0, device="cuda"):
    """RotaryEmbedding's fp32 frequencies, which the old forward kept and reused every step."""
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))


def old_rope(inv_freq, positions, dtype):
    """RotaryEmbedding.forward before session 14: the angles computed every step."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def main(out_path: str) -> None:
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(), "rows": []}
    with torch.device("cuda"):                     # as the engine builds its model: the table computed on the GPU
        rotary = RotaryEmbedding(128, 1_000_000.0, 40960).to(torch.bfloat16)
    freqs = frequencies()
    for batch in (256, 232, 168, 136, 104, 72, 40, 12):
        lens = torch.randint(100, 2048, (batch,), device="cuda")
        logits = torch.randn(batch, 151936, device="cuda").to(torch.bfloat16)
        positions = torch.randint(0, 2048, (batch,), device="cuda")
        assert torch.equal(greedy_argmax(logits), logits.argmax(-1))
        assert torch.equal(lens[longest_first(lens)], lens[torch.argsort(lens, descending=True)])
        for new, old in zip(rotary(positions, torch.bfloat16), old_rope(freqs, positions, torch.bfloat16)):
            assert torch.equal(new, old), "the table must hold what each step computed"
        row = {"batch": batch,
               "argsort_us": graph_us(lambda: torch.argsort(lens, descending=True)),
               "longest_first_us": graph_us(lambda: longest_first(lens)),
               "torch_argmax_us": graph_us(lambda: logits.argmax(-1)),
               "greedy_argmax_us": graph_us(lambda: greedy_argmax(logits)),
               "rope_per_step_us": graph_us(lambda: old_rope(freqs, positions, torch.bfloat16)),
               "rope_table_us": graph_us(lambda: rotary(positions, torch.bfloat16))}
        row["saved_us"] = (row["argsort_us"] - row["longest_first_us"] + row["torch_argmax_us"]
                           - row["greedy_argmax_us"] + row["rope_per_step_us"] - row["rope_table_us"])
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        result["rows"].append(row)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "small_kernels.json")
