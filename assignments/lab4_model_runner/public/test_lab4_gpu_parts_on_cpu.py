"""Lab 4: the two GPU regions, checked on a CPU.

- `lab4.kv_store_kernel` runs in Triton's interpreter (`TRITON_INTERPRET=1`, the kernel module loaded afresh
  with it set, in fp32: the interpreter mishandles bf16), against a plain indexed copy, with one interpreter
  bug patched for the test (`compare_as_on_a_gpu`). Needs the `triton` package (the lab 4 release installs
  it on Linux x86-64); without it the test is skipped, never passed.
- `lab4.graph_replay` runs with recorded graphs in place of CUDA graphs: each `RecordedGraph` copies what its
  static buffers hold when it is replayed, and writes hidden states computed from them, as a captured decode
  graph would. The bookkeeping is the region's whole job: the smallest bucket that fits, this step's inputs in
  its first rows, padding rows with slot -1 and context length 0 (or they write and read another sequence's
  K/V: common mistake 5), and the first `batch` hidden rows back.

The GPU tests (test_lab4_gpu.py) check the same regions compiled, with real graphs; the grader grades the two
GPU items only where CUDA exists.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from lab_diagnostics import assert_close, assert_same_list

pytestmark = pytest.mark.lab4

def compare_as_on_a_gpu(monkeypatch) -> None:
    """Make the interpreter's comparisons boolean, as compiled Triton's are, for this test only.

    Triton's interpreter (3.x) labels a comparison's result with its operands' type: a comparison of two
    scalars (`slot >= 0`) becomes an int32, a mask built from it (`(offs < ROW) & (slot >= 0)`) is int32 too,
    and `tl.load` refuses it ("mask has unsupported dtype"), though the GPU compiles the same kernel. Patched
    here so that a correct kernel passes whichever way it masks; run the interpreter yourself and you meet the
    bug (the handout's '解释器的限制' says how to write around it). Where the interpreter's internals differ
    (another triton), nothing is patched.
    """
    from triton.runtime import interpreter
    import triton.language as tl
    builder, handle = getattr(interpreter, "InterpreterBuilder", None), getattr(interpreter, "TensorHandle", None)
    if builder is None or handle is None:
        return
    for name in [n for n in dir(builder) if n.startswith(("create_icmp", "create_fcmp"))]:
        def compare(self, lhs, rhs, _original=getattr(builder, name)):
            return handle(_original(self, lhs, rhs).data.astype(bool), tl.int1)
        monkeypatch.setattr(builder, name, compare)


def interpreted_kv_store(impl, monkeypatch):
    """The student's kernel module, loaded afresh with TRITON_INTERPRET=1 (jit decides at decoration time)."""
    pytest.importorskip("triton", reason="the interpreter check of the Triton KV store needs the triton package")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    compare_as_on_a_gpu(monkeypatch)
    path = impl.module("kernels").__path__[0] + "/kv_store.py"
    spec = importlib.util.spec_from_file_location(f"{impl.package}_kv_store_interpreted", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.points(2)
@pytest.mark.covers("lab4.kv_store_kernel")
def test_triton_kv_store_in_the_interpreter(impl, monkeypatch):
    """13 tokens' K/V (2 heads x 8 dims: a 16-value row) into a 6-block x 4-slot cache; every fourth slot is -1."""
    store = interpreted_kv_store(impl, monkeypatch).store_kvcache_triton
    gen = torch.Generator().manual_seed(0)
    num_blocks, block_size, heads, dim, tokens = 6, 4, 2, 8, 13
    k = torch.randn(tokens, heads, dim, generator=gen)
    v = torch.randn(tokens, heads, dim, generator=gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens].to(torch.int64)
    slots[::4] = -1                                          # padding rows: must write nothing
    k_cache = torch.randn(num_blocks, block_size, heads, dim, generator=gen)   # not zeros: a skipped write shows
    v_cache = torch.randn(num_blocks, block_size, heads, dim, generator=gen)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // block_size, slot % block_size] = k[token]
            expected_v[slot // block_size, slot % block_size] = v[token]
    store(k, v, k_cache, v_cache, slots)
    assert_close("K cache [block, offset, head, dim] after the store", expected_k, k_cache, atol=0, rtol=0)
    assert_close("V cache [block, offset, head, dim] after the store", expected_v, v_cache, atol=0, rtol=0)


class RecordedGraph:
    """Stands in for one captured decode graph of `bucket` rows: replay() records its inputs, writes hidden states."""

    def __init__(self, static: dict[str, torch.Tensor], bucket: int, replays: list):
        self.static, self.bucket, self.replays = static, bucket, replays

    def replay(self) -> None:
        s, n = self.static, self.bucket
        self.replays.append({"bucket": n, **{name: s[name][:n].tolist() for name in
                                             ("input_ids", "positions", "slot_mapping", "context_lens")}})
        # What the graph computes, from its buffers only: row i's hidden state encodes its token and position.
        s["hidden"][:n] = (s["input_ids"][:n] * 1000 + s["positions"][:n]).to(s["hidden"].dtype).unsqueeze(1)


# Batches replayed in order: (rows, the bucket that must replay them). After the batch of 5 (bucket 8), the
# batch of 3 (bucket 4) has one padding row, row 3, that still holds the 5-batch's slot and context.
BATCHES = [(5, 8), (3, 4), (1, 1), (5, 8), (2, 2), (3, 4)]
MAX_BLOCKS, HIDDEN = 4, 3


@pytest.mark.points(2)
@pytest.mark.covers("lab4.graph_replay")
def test_graph_replay_fills_the_smallest_bucket_and_resets_its_padding_rows(impl):
    runner_cls = impl.module("engine.model_runner").ModelRunner
    meta_cls = impl.module("layers.attention").AttentionMetadata
    runner = runner_cls.__new__(runner_cls)          # no model, no device: only what the region reads
    largest = 8
    runner.static = {
        "input_ids": torch.zeros(largest, dtype=torch.int64), "positions": torch.zeros(largest, dtype=torch.int64),
        "slot_mapping": torch.full((largest,), -1, dtype=torch.int64),
        "context_lens": torch.zeros(largest, dtype=torch.int64),
        "block_tables": torch.zeros(largest, MAX_BLOCKS, dtype=torch.int64),
        "hidden": torch.zeros(largest, HIDDEN),
    }
    replays: list[dict] = []
    runner.graphs = {bucket: RecordedGraph(runner.static, bucket, replays) for bucket in (1, 2, 4, 8)}
    for step, (batch, bucket) in enumerate(BATCHES):
        ids = torch.arange(batch) + 10 * (step + 1)
        positions = torch.arange(batch) + 20 + step
        slots = torch.arange(batch) + 100 * (step + 1)
        lens = positions + 1
        tables = torch.arange(batch * 2).reshape(batch, 2) + 50 * step
        meta = meta_cls(is_prefill=False, slot_mapping=slots, block_tables=tables, context_lens=lens,
                        max_seqlen_q=1, max_seqlen_k=int(lens.max()))
        hidden = runner._replay_decode_graph(ids, positions, meta)
        assert len(replays) == step + 1, f"step {step} (batch {batch}): expected one graph replay, got " \
                                         f"{len(replays) - step}"
        seen = replays[-1]
        padding = bucket - batch
        expected = {"bucket": bucket, "input_ids": ids.tolist() + seen["input_ids"][batch:],
                    "positions": positions.tolist() + seen["positions"][batch:],
                    "slot_mapping": slots.tolist() + [-1] * padding, "context_lens": lens.tolist() + [0] * padding}
        for name in ("bucket", "input_ids", "positions", "slot_mapping", "context_lens"):
            want, got = expected[name], seen[name]
            if name == "bucket":
                if want != got:
                    pytest.fail(f"step {step}, a batch of {batch}: replayed the graph of {got} rows, expected the "
                                f"smallest that fits ({want})", pytrace=False)
                continue
            assert_same_list(f"step {step}, batch {batch} in the {bucket}-row graph: static {name} at replay "
                             f"(rows {batch}..{bucket - 1} are padding)", want, got, label=lambda i: f"row {i}")
        want = (ids * 1000 + positions).float().unsqueeze(1).expand(batch, HIDDEN)
        if tuple(hidden.shape) != (batch, HIDDEN):
            pytest.fail(f"step {step}: returned hidden states of shape {tuple(hidden.shape)}, expected the batch's "
                        f"{batch} rows ({(batch, HIDDEN)})", pytrace=False)
        assert_close(f"step {step}: hidden states returned (the graph's first {batch} rows)", want, hidden,
                     atol=0, rtol=0)
