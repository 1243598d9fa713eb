# Generated from reference/models/qwen3.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Qwen3 decoder, written to match Hugging Face's Qwen3ForCausalLM numerically.

Qwen3 = Llama-style blocks + grouped-query attention + an RMSNorm on each
head's q and k before RoPE. The q/k/v and gate/up projections are fused into
one matrix each (one GEMM instead of three or two); the loader fills them
from the checkpoint's separate tensors.

Under tensor parallelism (reference.layers.linear) each rank holds
num_heads / N query heads and num_key_value_heads / N KV heads, and its slice
of the MLP's intermediate features; o_proj and down_proj all-reduce.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from student_exercises.parallel_state import tp_world_size
from student_exercises.layers.attention import AttentionMetadata
from student_exercises.layers.linear import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalize in fp32, round back, then scale: the order transformers uses."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; cos, sin: [tokens, head_dim]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 cos: torch.Tensor, sin: torch.Tensor,
                 out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's per-head RMSNorm of q and k, then RoPE on both: [tokens, heads, head_dim] each.

    `out`: (q_out, k_out) to write the results into (and return) instead of new tensors.
    """
    q, k = apply_rope(rms_norm(q, q_weight, eps), cos, sin), apply_rope(rms_norm(k, k_weight, eps), cos, sin)
    if out is None:
        return q, k
    out[0].copy_(q)
    out[1].copy_(k)
    return out


class ElementwiseOps:
    """The small elementwise functions a layer calls, swappable as a set.

    Eager PyTorch runs each of them as several tiny kernels; on a GPU that is
    ~60 launches per layer, which cost a third of a decode step at batch 256.
    `fused()` returns the same functions compiled by torch.compile, each one
    fused Triton kernel (one per output shape), except the q/k norms with
    RoPE: inductor makes two kernels of that one, so a hand-written Triton
    kernel does it (reference/kernels/qk_norm_rope.py). The math is unchanged.

    The functions are cut so that each compiled one covers everything between
    two GEMMs: the q/k norms with RoPE are one (`qk_norm_rope`). In a decode
    step these kernels move a few hundred KB each, so each costs about a
    launch, not its bytes: fewer, larger fused functions mean fewer launches
    per layer. The residual adds are not here: they happen inside the GEMM
    that ends each block (`RowParallelLinear`'s `residual`), so each norm reads
    the stream once and writes only its output.
    """

    def __init__(self, rms_norm=rms_norm, qk_norm_rope=qk_norm_rope, silu_and_mul=silu_and_mul):
        self.rms_norm, self.qk_norm_rope, self.silu_and_mul = rms_norm, qk_norm_rope, silu_and_mul

    @staticmethod
    def fused() -> "ElementwiseOps":
        """One compiled set per process: every engine shares its compile cache.

        (A new set per engine would recompile the same functions again and
        again and hit torch.compile's recompile limit in a long test session.)
        """
        global _FUSED_OPS
        if _FUSED_OPS is None:
            from student_exercises.kernels.qk_norm_rope import qk_norm_rope_triton   # q and k in one launch, not two
            _FUSED_OPS = ElementwiseOps(compile_rows_dynamic(rms_norm), qk_norm_rope_triton,
                                        compile_rows_dynamic(silu_and_mul))
        return _FUSED_OPS


def compile_rows_dynamic(fn):
    """torch.compile `fn` with only the token dimension (dim 0 of each matrix argument) dynamic.

    Token counts change every step, so dim 0 must not be specialised. The
    other sizes (hidden, heads, head_dim) are the model's: with those symbolic
    too (`dynamic=True`) inductor could not vectorise the loads of a row or
    keep a 128-wide norm in registers, and a prefill step's elementwise
    kernels ran far below the memory bandwidth (docs/performance.md).

    The model's sizes are marked static, not merely left alone: otherwise a
    second shape in one process (a TP=2 engine after a TP=1 one, whose MLP
    shard is half as wide) makes torch.compile's automatic dynamic shapes
    recompile with every size symbolic, and that engine's kernels ran at half
    the bandwidth. Marked static, each new shape compiles a kernel of its own.
    The price: torch.compile keeps at most `recompile_limit` (8) versions of a
    function; past that many model shapes in one process the rest run eagerly.
    """
    compiled = torch.compile(fn)

    def call(*args):
        for arg in args:
            if isinstance(arg, torch.Tensor):
                rows_dynamic = arg.dim() > 1
                if rows_dynamic:
                    torch._dynamo.maybe_mark_dynamic(arg, 0)
                for dim in range(int(rows_dynamic), arg.dim()):
                    torch._dynamo.mark_static(arg, dim)
        return compiled(*args)
    return call


EAGER_OPS = ElementwiseOps()
_FUSED_OPS: ElementwiseOps | None = None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.ops = EAGER_OPS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)


def rope_theta(cfg: dict) -> float:
    """RoPE base: top-level `rope_theta` (Qwen3 checkpoints, transformers 4.x) or
    `rope_parameters.rope_theta` (transformers 5.x). Only plain RoPE is implemented."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ValueError(f"rope_type {kind!r} is not supported (only plain RoPE)")
    return float(params.get("rope_theta", cfg.get("rope_theta", 1_000_000.0)))


class RotaryEmbedding(nn.Module):
    """cos/sin of each position's rotation angles, computed once for every position the model takes.

    A forward looks its positions up in one table, [max_positions, 2 * head_dim]
    (cos, then sin), one gather for all layers: computing them per step took
    seven small kernels of a decode step (docs/performance.md, session 14).
    The angles are computed in fp32 and only the table is rounded to the
    model's dtype (with the model), as each step's computation was: a bf16
    `inv_freq` (once a buffer that `model.to(torch.bfloat16)` rounded to 8
    mantissa bits) bent the angles of late positions, position x frequency,
    and doubled the bf16 logit error before we fixed it.
    """

    def __init__(self, head_dim: int, base: float, max_positions: int):
        super().__init__()
        self.head_dim = head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.arange(max_positions).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_sin", torch.cat((emb.cos(), emb.sin()), dim=-1), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos_sin = self.cos_sin[positions].to(dtype)   # no copy once the model is in its dtype
        return cos_sin[:, :self.head_dim], cos_sin[:, self.head_dim:]


@dataclass
class AttentionInputs:
    """Preallocated homes of one layer's attention inputs, [tokens, ...] each.

    A prefill CUDA graph (reference/engine/prefill_graphs.py) stops at each
    attention call, which runs eagerly between two replays: the projections
    must land at addresses that outlive the graph piece that wrote them, so
    they are written here instead of into fresh tensors.
    """
    qkv: torch.Tensor   # [tokens, q_size + 2 * kv_size]: the fused projection; v is read from its tail
    q: torch.Tensor     # [tokens, heads, head_dim]: q after its norm and RoPE
    k: torch.Tensor     # [tokens, kv_heads, head_dim]: k after its norm and RoPE

    def rows(self, n: int) -> "AttentionInputs":
        """The first n tokens' rows (views)."""
        return AttentionInputs(self.qkv[:n], self.q[:n], self.k[:n])


class Qwen3Attention(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        world = tp_world_size()
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        self.num_heads = cfg["num_attention_heads"] // world        # this rank's heads
        self.num_kv_heads = cfg["num_key_value_heads"] // world
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        bias = cfg.get("attention_bias", False)
        full_q, full_kv = self.q_size * world, self.kv_size * world
        self.qkv_proj = ColumnParallelLinear(cfg["hidden_size"], [full_q, full_kv, full_kv], bias=bias)
        self.o_proj = RowParallelLinear(full_q, cfg["hidden_size"], bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(self.head_dim, cfg["rms_norm_eps"])
        self.scale = self.head_dim ** -0.5
        self.ops = EAGER_OPS
        # Set by the model runner once the KV cache exists.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.backend = None

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, meta: AttentionMetadata,
                residual: torch.Tensor | None = None, norm: nn.Module | None = None):
        """o_proj(attention(x)), added to `residual` if given (then consumed), and `norm` of that
        if given (then a pair): see RowParallelLinear."""
        return self.o_proj(self.attend(*self.project(rope, x), meta).flatten(1), residual, norm)

    def project(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                out: AttentionInputs | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (normed and rotated) and v of each token: [tokens, heads, head_dim] each; written into `out` if given."""
        qkv = self.qkv_proj(x, out=None if out is None else out.qkv)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.ops.qk_norm_rope(q.view(-1, self.num_heads, self.head_dim),
                                     k.view(-1, self.num_kv_heads, self.head_dim),
                                     self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, *rope,
                                     out=None if out is None else (out.q, out.k))
        return q, k, v.view(-1, self.num_kv_heads, self.head_dim)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Store this step's K/V in the cache, attend over it: [tokens, heads, head_dim] (into `out` if given)."""
        return self.backend.forward(q, k, v, self.k_cache, self.v_cache, meta, self.scale, out=out)


class Qwen3MLP(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        full = cfg["intermediate_size"]
        self.gate_up_proj = ColumnParallelLinear(cfg["hidden_size"], [full, full], what="intermediate_size")
        self.down_proj = RowParallelLinear(full, cfg["hidden_size"], what="intermediate_size")
        self.ops = EAGER_OPS

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, norm: nn.Module | None = None):
        """down(silu(gate(x)) * up(x)), added to `residual` if given (then consumed), and `norm` of that
        if given (then a pair): see RowParallelLinear."""
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)), residual, norm)


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.self_attn = Qwen3Attention(cfg)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, rope, x, h, meta, next_norm):
        """x + attn(norm(x)), then + mlp(norm(.)): the residual stream x in, with h = input_layernorm(x);
        out, the new stream and `next_norm` of it (the next layer's input norm, or the model's final one).

        Each add is done by the projection that ends its block (o_proj,
        down_proj), which on a GPU folds it into the GEMM and overwrites the
        stream it was given: `x` is consumed. The projection also applies the
        norm that reads the stream next: why the norms travel with the
        stream is tensor parallelism, where one kernel all-reduces, adds and
        normalizes (RowParallelLinear); on one device it is the textbook
        order, norm after add.
        """
        x, h = self.self_attn(rope, h, meta, residual=x, norm=self.post_attention_layernorm)
        return self.mlp(h, residual=x, norm=next_norm)

    def mlp_block(self, x):
        """x + mlp(norm(x)): the block's second half (prefill graphs call it after their own o_proj)."""
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class Qwen3Model(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        # The engine's max_model_len never exceeds max_position_embeddings (Config checks it).
        self.rotary = RotaryEmbedding(head_dim, rope_theta(cfg), int(cfg.get("max_position_embeddings", 4096)))

    def forward(self, input_ids, positions, meta):
        x = self.embed_tokens(input_ids)
        rope = self.rotary(positions, x.dtype)   # shared by every layer
        h = self.layers[0].input_layernorm(x)
        next_norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        for layer, next_norm in zip(self.layers, next_norms):
            x, h = layer(rope, x, h, meta, next_norm)
        return h


class Qwen3ForCausalLM(nn.Module):
    # checkpoint tensor name part -> (fused parameter name part, shard index)
    packed_modules = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: dict):
        super().__init__()
        self.model = Qwen3Model(cfg)
        self.lm_head = ParallelLMHead(cfg["vocab_size"], cfg["hidden_size"])
        if cfg.get("tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions, meta) -> torch.Tensor:
        """Hidden states of every input token: [num_tokens, hidden]."""
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """argmax of each row's logits (-1 where there is none), without whole rows under tensor parallelism."""
        return self.lm_head.greedy_tokens(hidden)

    def use_ops(self, ops: ElementwiseOps) -> None:
        """Route every layer's elementwise work through `ops` (e.g. ElementwiseOps.fused())."""
        for module in self.modules():
            if hasattr(module, "ops"):
                module.ops = ops
