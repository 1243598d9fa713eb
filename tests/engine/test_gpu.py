"""GPU-only checks (marked `gpu`, skipped without CUDA).

Token equality on the GPU is covered by running the whole suite with
`--device cuda` in fp32. bf16 cannot be held to token equality: rounding every
activation to 8 bits of mantissa flips near-tied argmaxes. The policy instead
(docs/gpu.md): the engine's bf16 last-position logits, compared with fp32
transformers on the same weights by ||a - b|| / ||b||, must be within 5e-2
and no worse than 1.5x transformers' own bf16 error, measured in the same run.
"""
from __future__ import annotations

import pytest
import torch
import transformers

from reference import LLM, SamplingParams
from courseware.oracle import engine_last_logits, hf_last_logits, random_prompts, rel_err

pytestmark = pytest.mark.gpu

BF16_MAX_REL_ERR = 5e-2
BF16_MAX_RATIO_TO_HF = 1.5


@pytest.fixture(scope="module")
def qwen3_small_dir(tmp_path_factory) -> str:
    """A random model with Qwen3-0.6B's per-layer shape (fewer layers, to keep the test short)."""
    from courseware.tiny_model import make_tiny_model
    src = make_tiny_model(tmp_path_factory.mktemp("src") / "m", seed=5)
    tiny = transformers.AutoConfig.from_pretrained(src)
    cfg = transformers.Qwen3Config(
        vocab_size=tiny.vocab_size, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
        rope_theta=1_000_000.0, tie_word_embeddings=True, eos_token_id=tiny.eos_token_id)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("qwen3shape") / "m"
    # Saved in bf16, as real Qwen3 checkpoints are; fp32 loads of it are exact.
    transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return str(out)


@pytest.mark.parametrize("which", ["tiny", "qwen3_shape"])
def test_bf16_logits_within_policy(which, tiny_model_dir, qwen3_small_dir):
    model_dir = tiny_model_dir if which == "tiny" else qwen3_small_dir
    vocab = transformers.AutoConfig.from_pretrained(model_dir).vocab_size
    prompts = random_prompts([7, 16, 33, 100, 250], vocab, seed=11)
    reference = hf_last_logits(model_dir, prompts, torch.float32, "cpu")
    ours = engine_last_logits(LLM(model_dir, device="cuda", dtype="bfloat16"), prompts)
    theirs = hf_last_logits(model_dir, prompts, torch.bfloat16, "cuda")
    ours_err, hf_err = rel_err(ours, reference), rel_err(theirs, reference)
    print(f"\n[{which}] bf16 rel. error vs fp32: engine {ours_err:.2e}, transformers {hf_err:.2e}")
    assert ours_err < BF16_MAX_REL_ERR
    assert ours_err <= BF16_MAX_RATIO_TO_HF * hf_err + 1e-6


def test_fp32_logits_on_gpu_match_cpu_oracle(tiny_model_dir):
    prompts = random_prompts([5, 40, 129], 1000, seed=12)
    ours = engine_last_logits(LLM(tiny_model_dir, device="cuda", dtype="float32"), prompts)
    reference = hf_last_logits(tiny_model_dir, prompts, torch.float32, "cpu")
    assert rel_err(ours, reference) < 1e-4


def test_auto_device_picks_cuda_and_the_checkpoint_dtype(tiny_model_dir, qwen3_small_dir):
    llm = LLM(tiny_model_dir)
    assert llm.config.device == "cuda"
    assert LLM(qwen3_small_dir, num_kvcache_blocks=64).config.torch_dtype == torch.bfloat16
    assert llm.model_runner.kv_cache.is_cuda
    assert llm.model_runner.num_kvcache_blocks > 1000, "KV pool sized from free GPU memory"


def test_automatic_gc_is_off_while_graphs_are_captured(tiny_model_dir, monkeypatch):
    """Every capture runs with automatic garbage collection off, and it is back on afterwards.

    A collection during capture can free another engine's CUDA objects (one left
    in a reference cycle), which is not allowed while a stream captures.
    """
    import gc
    from reference.models.qwen3 import Qwen3ForCausalLM
    seen: list[bool] = []
    original = Qwen3ForCausalLM.forward

    def forward(self, *args, **kwargs):
        if torch.cuda.is_current_stream_capturing():
            seen.append(gc.isenabled())
        return original(self, *args, **kwargs)
    monkeypatch.setattr(Qwen3ForCausalLM, "forward", forward)
    assert gc.isenabled()
    llm = LLM(tiny_model_dir, device="cuda", dtype="float32", max_num_seqs=8)
    assert len(seen) == len(llm.model_runner.graphs) and not any(seen)
    assert gc.isenabled(), "collection must be back on after capture"


def test_the_first_requests_compile_no_argmax_kernel(tiny_model_dir):
    """The engine's warm-up runs its own greedy argmax, so a served request's first step compiles nothing.

    The Triton argmax kernels compile at their first call; when that was the
    first request's step, the first requests after a server started waited
    about a second for their first token. Their in-memory caches are emptied
    first, so kernels compiled by earlier tests in this process do not count.
    """
    from reference.kernels import greedy_argmax as argmax_module
    kernels = {"_piece_argmax_kernel": argmax_module._piece_argmax_kernel,
               "_row_argmax_kernel": argmax_module._row_argmax_kernel}
    device = torch.cuda.current_device()
    for kernel in kernels.values():
        kernel.device_caches.clear()
    llm = LLM(tiny_model_dir, device="cuda", dtype="bfloat16", max_num_seqs=8)
    compiled = lambda: {name: len(kernel.device_caches[device][0]) for name, kernel in kernels.items()}
    after_start = compiled()
    assert all(after_start.values()), f"the warm-up did not run the engine's argmax kernels: {after_start}"
    prompts = random_prompts([5, 17], 1000, seed=3)
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    llm.generate(prompts, SamplingParams(temperature=0.8, top_p=0.9, max_tokens=4, seed=1), use_tqdm=False)
    assert compiled() == after_start, ("a request compiled an argmax kernel the warm-up should have: "
                                       f"{after_start} after start-up, {compiled()} after the requests")
