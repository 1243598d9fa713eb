# Generated from reference/engine/prefill_graphs.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""CUDA graphs for prefill steps: the work between two attention calls, captured per token bucket.

An eager prefill forward is a few hundred kernel launches from Python, and a
slow CPU (or a slow process: docs/performance.md) launched them more slowly
than the GPU ran them, so the GPU waited. Attention cannot go into a graph
with the rest: its grid and the prefix it gathers depend on the step's
sequences, not only on its token count. So, as vLLM's piecewise graphs do,
a step is cut at each attention call:

    piece 0      embedding, RoPE, layer 0 up to its attention inputs
    piece i      layer i-1 from o_proj through its MLP, layer i up to its attention inputs
    piece L      the last layer from o_proj, then the final norm

The pieces replay; each layer's attention runs eagerly between them on the
step's real tokens. A step of n tokens replays the pieces of the smallest
bucket b >= n: rows n..b are padding, whose GEMM and norm rows are computed
and never read (every one of these kernels works row by row).

What crosses a cut must sit at an address that outlives the piece that wrote
it: the attention inputs and output, and the hidden states, live in buffers
allocated once (`AttentionInputs`, `attn_out`, `hidden`). The residual stream
and RoPE's cos/sin cross cuts inside the graphs' memory pool: each is held
while the pieces that read it are captured, so the pool does not hand its
memory to them (the stream is one tensor, from the embedding on: each
block's o_proj and down_proj add into it in place). Pieces share one pool
across buckets and must replay in the order they were captured, which
`forward` does.

The price: padding rows (up to 2048 in a large step), the buffers for the
largest bucket, and capture time at start-up (layers + 1 pieces per bucket).
Steps above MAX_GRAPH_TOKENS run eagerly.
"""
from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from student_exercises.layers.attention import AttentionMetadata
from student_exercises.models.qwen3 import AttentionInputs, Qwen3Model

# Buckets: powers of two from SMALLEST_BUCKET to BUCKET_STEP, then every BUCKET_STEP tokens.
SMALLEST_BUCKET = 16
BUCKET_STEP = 2048
# Larger steps run eagerly: their GPU time outgrows the launches' CPU time, while each bucket
# costs capture time and the largest sets the buffers' and the pool's size.
MAX_GRAPH_TOKENS = 16384


def prefill_buckets(max_tokens: int) -> list[int]:
    """The token counts to capture, ascending, the last one `max_tokens` (a step never has more).

    Powers of two while they are small (a short prompt pads little), then one
    bucket every BUCKET_STEP tokens, so a large step pads at most that many rows.
    """
    buckets, size = [], SMALLEST_BUCKET
    while size < min(max_tokens, BUCKET_STEP):
        buckets.append(size)
        size *= 2
    size = BUCKET_STEP
    while size < max_tokens:
        buckets.append(size)
        size += BUCKET_STEP
    return buckets + [max_tokens]


@contextmanager
def no_gc_while_capturing() -> Iterator[None]:
    """Collect now, then hold garbage collection off until the capture is over.

    A collection during capture may free another engine's CUDA objects (an
    engine caught in a reference cycle), and freeing is not allowed while a
    stream captures: the capture fails and leaves the device unusable.
    """
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class PrefillGraphs:
    """The pieces of a prefill forward as CUDA graphs, one list per token bucket; attention runs eagerly."""

    def __init__(self, model: Qwen3Model, max_tokens: int):
        """`max_tokens`: the largest step to capture for (at most MAX_GRAPH_TOKENS)."""
        self.model = model
        self.buckets = prefill_buckets(min(max_tokens, MAX_GRAPH_TOKENS))
        attn = model.layers[0].self_attn
        weight = model.embed_tokens.weight
        n, device, dtype = self.buckets[-1], weight.device, weight.dtype
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.inputs = AttentionInputs(
            qkv=torch.zeros(n, attn.q_size + 2 * attn.kv_size, dtype=dtype, device=device),
            q=torch.zeros(n, attn.num_heads, attn.head_dim, dtype=dtype, device=device),
            k=torch.zeros(n, attn.num_kv_heads, attn.head_dim, dtype=dtype, device=device))
        # v, read by attention straight from the tail of the qkv projection: a view made once.
        self.v = self.inputs.qkv[:, attn.q_size + attn.kv_size:].view(n, attn.num_kv_heads, attn.head_dim)
        self.attn_out = torch.zeros(n, attn.num_heads, attn.head_dim, dtype=dtype, device=device)
        self.hidden = torch.zeros(n, weight.shape[1], dtype=dtype, device=device)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}

    def fits(self, num_tokens: int) -> bool:
        return num_tokens <= self.buckets[-1]

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket's pieces, largest bucket first, all in one memory pool."""
        pool = None
        with no_gc_while_capturing():
            for bucket in reversed(self.buckets):
                pieces = self._pieces(bucket)
                for piece in pieces:    # warm-up, eagerly: compiled ops and cuBLAS set up outside the capture
                    piece()
                torch.cuda.synchronize()   # the warm-up's collectives done before a capture starts (under TP)
                graphs = []
                for piece in pieces:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool):
                        piece()
                    pool = graph.pool() if pool is None else pool
                    graphs.append(graph)
                self.graphs[bucket] = graphs
        torch.cuda.synchronize()

    def _pieces(self, bucket: int) -> list[Callable[[], None]]:
        """The step's pieces on `bucket` rows, as closures; `state` carries the stream and RoPE between them.

        state["stream"] is referenced from the first piece to the last (the
        last clears it), so its memory stays out of the pool's hands while the
        pieces between are captured.
        """
        model, layers, inputs = self.model, self.model.layers, self.inputs.rows(bucket)
        state: dict = {}

        def start(layer) -> Callable[[], None]:
            def piece():
                state["stream"] = x = model.embed_tokens(self.input_ids[:bucket])
                state["rope"] = model.rotary(self.positions[:bucket], x.dtype)
                layer.self_attn.project(state["rope"], layer.input_layernorm(x), inputs)
            return piece

        def between(done, layer) -> Callable[[], None]:
            def piece():
                state["stream"] = x = self._finish_layer(done, bucket, state["stream"])
                layer.self_attn.project(state["rope"], layer.input_layernorm(x), inputs)
            return piece

        def end(done) -> Callable[[], None]:
            def piece():
                self.hidden[:bucket] = model.norm(self._finish_layer(done, bucket, state["stream"]))
                state.clear()
            return piece

        return [start(layers[0]), *(between(a, b) for a, b in zip(layers, layers[1:])), end(layers[-1])]

    def _finish_layer(self, layer, rows: int, stream: torch.Tensor) -> torch.Tensor:
        """The layer from its o_proj (reading the attention output buffer) to its end: the stream."""
        return layer.mlp_block(layer.self_attn.o_proj(self.attn_out[:rows].flatten(1), stream))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states of the step's tokens, [num_tokens, hidden]: a view of a buffer the next step overwrites."""
        n = input_ids.shape[0]
        bucket = next(b for b in self.buckets if b >= n)
        self.input_ids[:n] = input_ids
        self.positions[:n] = positions
        q, k, v = self.inputs.q[:n], self.inputs.k[:n], self.v[:n]
        graphs = self.graphs[bucket]
        for graph, layer in zip(graphs, self.model.layers):
            graph.replay()
            layer.self_attn.attend(q, k, v, meta, out=self.attn_out[:n])
        graphs[-1].replay()
        return self.hidden[:n]
