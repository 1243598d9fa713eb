"""Tensor-parallel layers: each rank holds a slice of a weight and its forward ends in one collective.

    ColumnParallelLinear   output features split: rank r computes its columns, no communication
    RowParallelLinear      input features split: partial sums, then an all-reduce
    VocabParallelEmbedding vocabulary rows split: look up own rows, zeros elsewhere, all-reduce
    ParallelLMHead         vocabulary rows split: own logits, then an all-gather

A column-parallel layer followed by a row-parallel one (QKV -> attention ->
o_proj, gate/up -> SiLU -> down) needs one all-reduce per pair: the
elementwise work in between runs on each rank's own heads or columns.

Each parameter carries a `weight_loader(param, full_tensor, shard)` that cuts
this rank's slice out of a checkpoint tensor, so the loader never needs to know
how a layer is split. At world size 1 every slice is the whole tensor and the
layers are plain nn.Linear / nn.Embedding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reference.layers.sampler import vocab_parallel_greedy_tokens
from reference.parallel_state import (all_gather_last_dim, all_reduce, all_reduce_add, all_reduce_add_norm, tp_rank,
                                      tp_world_size)


def _split(size: int, what: str) -> int:
    world = tp_world_size()
    if size % world:
        raise ValueError(f"{what}={size} is not divisible by tensor_parallel_size={world}")
    return size // world


class ColumnParallelLinear(nn.Linear):
    """y = x W^T with W's rows (output features) split over ranks.

    `output_sizes` names the logical matrices fused into this one (q, k, v or
    gate, up): each is split on its own, so rank r holds [q_r; k_r; v_r], the
    heads it attends with, not a slice across the q/k boundary.
    """

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False, what: str = "output size"):
        self.local_sizes = [_split(size, what) for size in output_sizes]
        super().__init__(in_features, sum(self.local_sizes), bias=bias)
        self.tp_rank = tp_rank()
        for param in self.parameters():
            param.weight_loader = self.load_shard

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x W^T (+ b); `out`: a [tokens, out_features] tensor to write it into (a CUDA graph's fixed address)."""
        if out is None:
            return F.linear(x, self.weight, self.bias)
        if self.bias is None:
            return torch.mm(x, self.weight.t(), out=out)
        return torch.addmm(self.bias, x, self.weight.t(), out=out)

    def load_shard(self, param: nn.Parameter, full: torch.Tensor, shard: int | None) -> None:
        index = 0 if shard is None else shard
        size = self.local_sizes[index]
        offset = sum(self.local_sizes[:index])
        param.data.narrow(0, offset, size).copy_(full.narrow(0, self.tp_rank * size, size))


class RowParallelLinear(nn.Linear):
    """y = all_reduce(x_r W_r^T) + b, with W's columns (input features) split over ranks.

    The bias is added once, after the sum; added per rank it would count N times.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, what: str = "input size"):
        super().__init__(_split(in_features, what), out_features, bias=bias)
        self.tp_rank, self.tp_size = tp_rank(), tp_world_size()
        self.weight.weight_loader = self.load_shard

    def load_shard(self, param: nn.Parameter, full: torch.Tensor, shard: int | None) -> None:
        size = param.shape[1]
        param.data.copy_(full.narrow(1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, norm: nn.Module | None = None):
        """all_reduce(x_r W_r^T) + b, plus `residual` (the stream this block ends in) if given.

        With `norm` (the RMSNorm that reads the stream next) it returns
        (stream, norm(stream)): under tensor parallelism on GPUs one kernel
        then all-reduces, adds and normalizes (`all_reduce_add_norm`); on
        one GPU or a CPU it is the same as calling the norm afterwards.

        On a GPU at world size 1 the residual is added in the GEMM itself:
        cuBLAS's epilogue adds C (beta = 1) as it writes the product, so the
        sum costs no pass of its own, where `residual + y` reads both and
        writes the sum (what that saves a prefill step: docs/performance.md,
        session 11). It writes into `residual`'s own storage (`addmm_`;
        out-of-place `addmm` would copy the residual first, the very pass it
        saves), so the caller's stream is consumed. The price
        is in the last bit: where the separate add rounds twice (the product
        to bf16, then the sum), cuBLAS may round once, after adding in fp32.
        Which it does depends on the kernel it picks for the shape (measured
        at Qwen3-0.6B's shapes: docs/performance.md, session 11), so a bf16
        stream can differ from transformers' by a rounding per add
        (tests/engine/test_fused_ops.py bounds it). On a CPU the sum stays the
        textbook `residual + y`, bit for bit. Under tensor parallelism the add
        goes into the all-reduce instead (`all_reduce_add`), which on GPUs with
        the one-shot all-reduce also writes into the stream it was given.
        """
        if norm is not None:
            if residual is not None and self.bias is None and self.tp_size > 1:
                return all_reduce_add_norm(F.linear(x, self.weight), residual, norm, self.tp_size)
            stream = self.forward(x, residual)
            return stream, norm(stream)
        if residual is None:
            y = all_reduce(F.linear(x, self.weight), self.tp_size)
            return y if self.bias is None else y + self.bias
        if x.is_cuda and self.tp_size == 1 and self.bias is None:
            return residual.addmm_(x, self.weight.t())
        if self.bias is None:
            return all_reduce_add(F.linear(x, self.weight), residual, self.tp_size)
        return residual + self.forward(x)


def _vocab_rows_loader(rank: int):
    """A loader of rows [rank * per_rank, (rank + 1) * per_rank) of the vocabulary; the last rank's tail stays zero."""
    def load(param: nn.Parameter, full: torch.Tensor, shard: int | None) -> None:
        per_rank = param.shape[0]
        start = rank * per_rank
        rows = max(0, min(per_rank, full.shape[0] - start))
        param.data.zero_()
        param.data[:rows].copy_(full[start:start + rows])
    return load


class VocabParallelEmbedding(nn.Embedding):
    """Each rank embeds the token ids in its vocabulary slice (zeros for the rest); the all-reduce sums them."""

    def __init__(self, vocab_size: int, hidden_size: int):
        self.vocab_size = vocab_size
        self.tp_size = tp_world_size()
        per_rank = -(-vocab_size // self.tp_size)   # padded up: the vocabulary need not divide
        super().__init__(per_rank, hidden_size)
        self.start = tp_rank() * per_rank
        self.weight.weight_loader = _vocab_rows_loader(tp_rank())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return all_reduce(x, self.tp_size)


class ParallelLMHead(nn.Module):
    """Logits of this rank's vocabulary slice, all-gathered into full rows (padding cut off).

    Gathering on every rank (not only rank 0) keeps the ranks symmetric; only
    rank 0 samples, so the other ranks' copies are the price of that symmetry.
    A batch that only takes argmaxes needs no whole rows: `greedy_tokens`.
    """

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.tp_size = tp_world_size()
        per_rank = -(-vocab_size // self.tp_size)
        self.start = tp_rank() * per_rank
        self.local_vocab = max(0, min(per_rank, vocab_size - self.start))   # the last slice may be padded
        self.weight = nn.Parameter(torch.empty(per_rank, hidden_size))
        self.weight.weight_loader = _vocab_rows_loader(tp_rank())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return all_gather_last_dim(F.linear(hidden, self.weight), self.tp_size)[..., :self.vocab_size]

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each row's greedy token (-1: no valid argmax), on every rank, without gathering the logits."""
        local = F.linear(hidden, self.weight)[:, :self.local_vocab]   # the padding's zero logits must not win
        return vocab_parallel_greedy_tokens(local, self.start, self.tp_size)
