"""The model's fused elementwise functions (reference.models.qwen3.ElementwiseOps).

CPU: each residual add is done by the projection that ends its block
(`RowParallelLinear(x, residual)`), and q/k norms run with RoPE
(`qk_norm_rope`). Eagerly that must be the same arithmetic as the textbook
block, x + attn(norm(x)) then + mlp(norm(.)), so the check is bit for bit
against that block written out here from the plain functions.
GPU (`gpu` marker): the torch.compile'd set, which the engine uses on CUDA,
against the eager set on fresh random inputs, within each dtype's rounding;
and the residual add that cuBLAS does in the GEMM's epilogue on CUDA against
the separate add: in bf16 within one rounding of it, value by value.
"""
from __future__ import annotations

import pytest
import torch

from reference.models import qwen3
from reference.models.qwen3 import EAGER_OPS, ElementwiseOps, Qwen3Model, apply_rope, rms_norm

CFG = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
           num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10_000.0)


class StubAttention(torch.nn.Module):
    """Stands in for attention (no KV cache needed): q, k after qk_norm_rope and v, mixed by one matrix."""

    def __init__(self, attn: qwen3.Qwen3Attention, gen: torch.Generator, textbook: bool):
        super().__init__()
        self.attn, self.textbook = attn, textbook
        self.mix = torch.randn(attn.q_size + 2 * attn.kv_size, attn.q_size, generator=gen) * 0.1

    def forward(self, rope, x, meta, residual=None, norm=None):
        a = self.attn
        q, k, v = a.qkv_proj(x).split([a.q_size, a.kv_size, a.kv_size], dim=-1)
        q, k = q.view(-1, a.num_heads, a.head_dim), k.view(-1, a.num_kv_heads, a.head_dim)
        if self.textbook:      # the unfused order: norm each, then rotate each
            q = apply_rope(rms_norm(q, a.q_norm.weight, a.q_norm.eps), *rope)
            k = apply_rope(rms_norm(k, a.k_norm.weight, a.k_norm.eps), *rope)
        else:
            q, k = a.ops.qk_norm_rope(q, k, a.q_norm.weight, a.k_norm.weight, a.q_norm.eps, *rope)
        mixed = torch.cat([q.flatten(1), k.flatten(1), v], dim=-1) @ self.mix.to(x)
        return a.o_proj(mixed, residual, norm)


def random_model(dtype: torch.dtype, seed: int) -> Qwen3Model:
    gen = torch.Generator().manual_seed(seed)
    model = Qwen3Model(CFG)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if p.ndim == 1 else 0.0))
    return model.to(dtype)


def textbook_forward(model: Qwen3Model, ids: torch.Tensor, positions: torch.Tensor, attns) -> torch.Tensor:
    """Each block as first written: x = x + attn(norm(x)); x = x + mlp(norm(x)); then the final norm."""
    x = model.embed_tokens(ids)
    rope = model.rotary(positions, x.dtype)
    for layer, attn in zip(model.layers, attns):
        x = x + attn(rope, rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.eps), None)
        x = x + layer.mlp(rms_norm(x, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps))
    return rms_norm(x, model.norm.weight, model.norm.eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_stream_forward_is_the_textbook_block_bit_for_bit(dtype):
    """On the CPU. On CUDA the adds run in cuBLAS's epilogue, within a rounding of these (the last test)."""
    for seed in range(2):
        model = random_model(dtype, seed)
        gen = torch.Generator().manual_seed(100 + seed)
        textbook = [StubAttention(layer.self_attn, gen, textbook=True) for layer in model.layers]
        for layer, stub in zip(model.layers, textbook):
            layer.self_attn = StubAttention(stub.attn, torch.Generator(), textbook=False)
            layer.self_attn.mix = stub.mix
        ids = torch.randint(0, CFG["vocab_size"], (11,), generator=gen)
        positions = torch.randperm(200, generator=gen)[:11]
        with torch.no_grad():
            want = textbook_forward(model, ids, positions, textbook)
            got = model(ids, positions, None)
        assert got.dtype == dtype and torch.isfinite(got).all()
        assert torch.equal(got, want), f"seed {seed}: max diff {float((got.float() - want.float()).abs().max())}"


TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 5e-4), (torch.bfloat16, 8e-3)])
def test_rotary_table_gives_each_positions_cos_and_sin(dtype, tol):
    """The table a forward looks positions up in, against cos/sin of position x frequency in fp64.

    fp32 angles of late positions are off by up to ~2e-4 rad (the product's rounding, as transformers has
    it too); bf16 adds its rounding once. Repeated and unordered positions look up the same rows.
    """
    head_dim, base = 16, 10_000.0
    positions = torch.tensor([0, 1, 17, 4095, 17, 2])
    cos, sin = qwen3.RotaryEmbedding(head_dim, base, 4096).to(dtype)(positions, dtype)
    assert cos.shape == sin.shape == (6, head_dim) and cos.dtype == sin.dtype == dtype
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.double()[:, None] * inv_freq[None, :]
    for got, want in ((cos, angles.cos()), (sin, angles.sin())):
        assert torch.equal(got[:, :head_dim // 2], got[:, head_dim // 2:]), "each frequency drives a pair of halves"
        assert (got[:, :head_dim // 2].double() - want).abs().max() < tol
    assert torch.equal(cos[2], cos[4]) and torch.equal(sin[2], sin[4])


def test_a_second_model_shape_compiles_its_own_static_kernel(monkeypatch):
    """Only the token dimension is dynamic, also for a second shape in one process (a TP=2 engine's half-wide
    MLP after a TP=1 engine's): torch.compile's automatic dynamic shapes would otherwise recompile with every
    size symbolic, which made that engine's kernels run at half the bandwidth."""
    compiles = []

    def record(graph, example_inputs):
        compiles.append(sum(isinstance(x, torch.SymInt) for x in example_inputs))
        return graph.forward
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn: real_compile(fn, backend=record))

    def gated(gate_up, weight):        # a function of its own: dynamo keeps its versions per code object
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up * weight
    fn = qwen3.compile_rows_dynamic(gated)
    for rows, width in [(5, 8), (7, 8), (3, 4), (9, 4), (6, 8)]:
        x, weight = torch.randn(rows, width), torch.randn(width // 2)
        assert torch.equal(fn(x, weight), gated(x, weight))
    assert compiles == [1, 1], f"symbolic sizes per compile: {compiles} (one per width, rows only)"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 37, 256])
def test_gpu_compiled_ops_match_eager(dtype, tokens):
    """Qwen3-0.6B's shapes (hidden 1024, 16/8 heads of 128); q and k as views into one qkv row, as in the model."""
    fused = ElementwiseOps.fused()
    gen = torch.Generator().manual_seed(tokens)
    rnd = lambda *shape: torch.randn(*shape, generator=gen).to(dtype).cuda()
    x, w = rnd(tokens, 1024), rnd(1024).abs() + 0.5
    assert rel_err(fused.rms_norm(x, w, 1e-6), EAGER_OPS.rms_norm(x, w, 1e-6)) < TOL[dtype]
    q, k, _ = rnd(tokens, 4096).split([2048, 1024, 1024], dim=-1)
    q, k = q.view(-1, 16, 128), k.view(-1, 8, 128)
    rope = qwen3.RotaryEmbedding(128, 1e6, 4096).cuda()(torch.randint(0, 4096, (tokens,)).cuda(), dtype)
    qw, kw = rnd(128).abs() + 0.5, rnd(128).abs() + 0.5
    got = fused.qk_norm_rope(q, k, qw, kw, 1e-6, *rope)
    want = EAGER_OPS.qk_norm_rope(q, k, qw, kw, 1e-6, *rope)
    for g, e in zip(got, want):
        assert g.shape == e.shape and torch.isfinite(g).all()
        assert rel_err(g, e) < TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 37, 256, 4096])
@pytest.mark.parametrize("in_features", [2048, 3072])      # Qwen3-0.6B's o_proj and down_proj
def test_gpu_residual_add_in_the_gemm_matches_the_separate_add(dtype, tokens, in_features):
    """On CUDA `RowParallelLinear(x, residual)` adds in cuBLAS's epilogue, into the residual's storage."""
    from reference.layers.linear import RowParallelLinear
    gen = torch.Generator().manual_seed(tokens + in_features)
    proj = RowParallelLinear(in_features, 1024).to(dtype).cuda()
    with torch.no_grad():
        proj.weight.copy_(torch.randn(proj.weight.shape, generator=gen) / in_features ** 0.5)
        x = torch.randn(tokens, in_features, generator=gen).to(dtype).cuda()
        residual = torch.randn(tokens, 1024, generator=gen).to(dtype).cuda()
        product = torch.nn.functional.linear(x, proj.weight)
        want = residual + product
        exact = torch.addmm(residual.double(), x.double(), proj.weight.double().t())
        got = proj(x, residual)
    assert got.data_ptr() == residual.data_ptr(), "the sum should be written into the residual's storage"
    if dtype == torch.bfloat16:
        # Against the exact sum (fp64): no farther from it than the separate add is, give or take one bf16 step
        # (8 significant bits) at the larger of product and sum, the rounding the epilogue may skip or add.
        big = torch.stack([product.double().abs(), exact.abs(), got.double().abs()]).amax(0)
        step = torch.exp2(torch.floor(torch.log2(big.clamp_min(1e-30))) - 7)
        excess = ((got.double() - exact).abs() - (want.double() - exact).abs()) / step
        assert excess.max() <= 1, (f"{int((excess > 1).sum())} of {want.numel()} sums are farther from the exact "
                                   f"sum than the separate add's by more than a bf16 step (up to {float(excess.max()):.1f})")
    else:
        assert rel_err(got, want) < TOL[dtype]
