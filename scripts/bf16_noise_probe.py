"""Diagnostic: how much does bf16 logit error vary between equally valid computation paths?

Compares, against fp32 transformers on CPU, the engine in bf16 (batched and one prompt
at a time) and transformers in bf16 with its sdpa and eager attention. Used once to
set the bf16 tolerance policy in tests/engine/test_gpu.py; numbers recorded in docs/gpu.md.
Run on a GPU: python scripts/bf16_noise_probe.py
"""
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, ".")
from reference import LLM  # noqa: E402
from courseware.oracle import random_prompts  # noqa: E402
from courseware.oracle import engine_last_logits, hf_last_logits, rel_err  # noqa: E402
from courseware.tiny_model import make_tiny_model  # noqa: E402

tmp = tempfile.mkdtemp()
src = make_tiny_model(f"{tmp}/src", seed=5)
for seed in (0, 1):
    cfg = transformers.Qwen3Config(vocab_size=1024, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
                                   num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                   max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=True)
    torch.manual_seed(seed)
    out = f"{tmp}/m{seed}"
    transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(src).save_pretrained(out)
    prompts = random_prompts([7, 16, 33, 100, 250, 64, 128, 300], 1024, seed=11 + seed)
    ref = hf_last_logits(out, prompts, torch.float32, "cpu")
    batched = rel_err(engine_last_logits(LLM(out, device="cuda", dtype="bfloat16"), prompts), ref)
    alone = rel_err(torch.cat([engine_last_logits(LLM(out, device="cuda", dtype="bfloat16"), [p]) for p in prompts]), ref)
    sdpa = rel_err(hf_last_logits(out, prompts, torch.bfloat16, "cuda"), ref)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16, attn_implementation="eager").cuda()
    with torch.no_grad():
        eager = rel_err(torch.stack([model(torch.tensor([p], device="cuda")).logits[0, -1].float().cpu() for p in prompts]), ref)
    print(f"seed {seed}: engine batched {batched:.2e}, engine one-by-one {alone:.2e}, "
          f"transformers sdpa {sdpa:.2e}, transformers eager {eager:.2e}")
