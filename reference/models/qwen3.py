"""Qwen3 decoder, written to match Hugging Face's Qwen3ForCausalLM numerically.

Qwen3 = Llama-style blocks + grouped-query attention + an RMSNorm on each
head's q and k before RoPE. The q/k/v and gate/up projections are fused into
one matrix each (one GEMM instead of three or two); the loader fills them
from the checkpoint's separate tensors.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from reference.layers.attention import AttentionMetadata


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_theta(cfg: dict) -> float:
    """RoPE base: top-level `rope_theta` (Qwen3 checkpoints, transformers 4.x) or
    `rope_parameters.rope_theta` (transformers 5.x). Only plain RoPE is implemented."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ValueError(f"rope_type {kind!r} is not supported (only plain RoPE)")
    return float(params.get("rope_theta", cfg.get("rope_theta", 1_000_000.0)))


class RotaryEmbedding(nn.Module):
    """RoPE with the 'rotate half' layout, cos/sin computed in fp32 from positions.

    `inv_freq` is deliberately not a buffer: `model.to(torch.bfloat16)` would
    round it to 8 mantissa bits, and the angles of late positions (position x
    frequency) would drift; that doubled the bf16 logit error before we fixed it.
    """

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        self.inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None, :].to(q.dtype), emb.sin()[:, None, :].to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Qwen3Attention(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        bias = cfg.get("attention_bias", False)
        self.qkv_proj = nn.Linear(cfg["hidden_size"], self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, cfg["hidden_size"], bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(self.head_dim, cfg["rms_norm_eps"])
        self.rotary = RotaryEmbedding(self.head_dim, rope_theta(cfg))
        self.scale = self.head_dim ** -0.5
        # Set by the model runner once the KV cache exists.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.backend = None

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.view(-1, self.num_heads, self.head_dim))
        k = self.k_norm(k.view(-1, self.num_kv_heads, self.head_dim))
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        o = self.backend.forward(q, k, v, self.k_cache, self.v_cache, meta, self.scale)
        return self.o_proj(o.flatten(1))


class Qwen3MLP(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.intermediate = cfg["intermediate_size"]
        self.gate_up_proj = nn.Linear(cfg["hidden_size"], 2 * self.intermediate, bias=False)
        self.down_proj = nn.Linear(self.intermediate, cfg["hidden_size"], bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.self_attn = Qwen3Attention(cfg)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, positions, x, meta):
        x = x + self.self_attn(positions, self.input_layernorm(x), meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Model(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, input_ids, positions, meta):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(positions, x, meta)
        return self.norm(x)


class Qwen3ForCausalLM(nn.Module):
    # checkpoint tensor name part -> (fused parameter name part, shard index)
    packed_modules = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: dict):
        super().__init__()
        self.model = Qwen3Model(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        if cfg.get("tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions, meta) -> torch.Tensor:
        """Hidden states of every input token: [num_tokens, hidden]."""
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
