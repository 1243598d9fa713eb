"""Differential fuzzing of the engine against transformers, one random case at a time.

A case draws a model shape, an engine configuration, a batch of prompts with
stop tokens, and a way to consume them (generate, streams, an abort), all from
one seed, and checks every request's tokens against transformers' greedy
`generate` on the same weights. `tests/engine/test_fuzz_vs_hf.py` runs a few seeds in
CI; `scripts/fuzz_engine.py` runs many for as long as you like.
"""
from __future__ import annotations

import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

from reference import LLM, SamplingParams
from courseware.oracle import hf_greedy

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@dataclass
class Case:
    seed: int
    shape: dict
    engine: dict
    prompts: list[list[int]]
    params: list[SamplingParams]
    mode: str                     # "generate" | "streams" | "abort"
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return (f"seed {self.seed}: shape {self.shape}, engine {self.engine}, mode {self.mode}, "
                f"prompt lengths {[len(p) for p in self.prompts]}, "
                f"max_tokens {[p.max_tokens for p in self.params]}, stops {[p.stop_token_ids for p in self.params]}")


def random_shape(rng: random.Random) -> dict:
    heads = rng.choice([2, 4, 8])
    return {"hidden_size": rng.choice([32, 64, 96]), "num_attention_heads": heads,
            "num_key_value_heads": rng.choice([k for k in (1, 2, 4, 8) if heads % k == 0]),
            "head_dim": rng.choice([8, 16, 32]), "num_hidden_layers": rng.randint(1, 3),
            "intermediate_size": rng.choice([48, 64, 128]), "tie_word_embeddings": rng.random() < 0.5}


def build_model(shape: dict, seed: int, tokenizer_dir: str, out: Path) -> str:
    """A random-weight Qwen3 of `shape` with the tiny model's tokenizer, saved in HF format."""
    config = transformers.Qwen3Config(vocab_size=1024, max_position_embeddings=512, rms_norm_eps=1e-6,
                                      bos_token_id=1021, pad_token_id=1022, eos_token_id=1023, **shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.Qwen3ForCausalLM(config).to(torch.float32).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_dir) / name).is_file():
            shutil.copy(Path(tokenizer_dir) / name, out / name)
    return str(out)


def random_case(seed: int, model_dir: str) -> Case:
    """Engine settings, prompts and stop rules drawn from `seed` (stops picked from the oracle's own run)."""
    rng = random.Random(seed)
    block = rng.choice([1, 2, 4, 16])
    chunked = rng.random() < 0.4
    engine = {"kvcache_block_size": block, "num_kvcache_blocks": rng.randint(60 // block + 8, 400 // block + 8),
              "max_model_len": 128, "enable_prefix_caching": rng.random() < 0.7,
              "enable_chunked_prefill": chunked, "max_num_seqs": rng.randint(1, 6),
              "max_num_batched_tokens": rng.randint(8, 64) if chunked else 128,
              "async_scheduling": rng.random() < 0.3}
    shared = [rng.randrange(1000) for _ in range(rng.randint(0, 20))]
    prompts = [shared + [rng.randrange(1000) for _ in range(rng.randint(1, 30))] for _ in range(rng.randint(1, 5))]
    params = []
    for prompt in prompts:
        max_tokens = rng.randint(1, 16)
        stops: list[int] = []
        if rng.random() < 0.4:
            stops = [rng.choice(hf_greedy(model_dir, prompt, max_tokens))]
        params.append(SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=stops,
                                     ignore_eos=rng.random() < 0.5))
    return Case(seed, {}, engine, prompts, params, rng.choice(["generate", "streams", "abort"]))


def expected_tokens(model_dir: str, prompt: list[int], params: SamplingParams) -> list[int]:
    """transformers' greedy tokens, cut after the first stop token (kept, as transformers keeps EOS)."""
    tokens = hf_greedy(model_dir, prompt, params.max_tokens, stop_at_eos=not params.ignore_eos)
    for i, token in enumerate(tokens):
        if token in params.stop_token_ids:
            return tokens[:i + 1]
    return tokens


def run_case(seed: int, workdir: Path, tokenizer_dir: str) -> Case:
    """Build, run and check one case; raises AssertionError with the case's description on a mismatch."""
    rng = random.Random(seed)
    shape = random_shape(rng)
    model_dir = build_model(shape, seed, tokenizer_dir, workdir / f"model-{seed}")
    case = random_case(seed, model_dir)
    case.shape = shape
    llm = LLM(model_dir, device="cpu", dtype="float32", **case.engine)
    expected = [expected_tokens(model_dir, p, sp) for p, sp in zip(case.prompts, case.params)]
    if case.mode == "generate":
        got = [o["token_ids"] for o in llm.generate(case.prompts, case.params, use_tqdm=False)]
        assert got == expected, case.describe()
    elif case.mode == "streams":
        half = max(1, len(case.prompts) // 2)
        streams = [llm.stream(case.prompts[:half], case.params[:half]),
                   llm.stream(case.prompts[half:], case.params[half:])] if len(case.prompts) > 1 else \
                  [llm.stream(case.prompts, case.params)]
        got: list[dict[int, list[int]]] = [{} for _ in streams]
        live = dict(enumerate(streams))
        while live:
            for k, stream in list(live.items()):
                chunk = next(stream, None)
                if chunk is None:
                    del live[k]
                else:
                    got[k].setdefault(chunk.index, []).extend(chunk.token_ids)
        flat = [got[0].get(i, []) for i in range(half)] + \
               ([got[1].get(i, []) for i in range(len(case.prompts) - half)] if len(streams) > 1 else [])
        assert flat == expected, case.describe()
    else:   # abort: stop consuming a stream after its first chunk; a later request must be unaffected
        stream = llm.stream(case.prompts, case.params)
        first = next(stream)
        assert first.token_ids == expected[first.index][:len(first.token_ids)], case.describe()
        stream.close()
        assert llm.block_manager.num_used_blocks == 0, case.describe()
        again = llm.generate(case.prompts[-1:], case.params[-1:], use_tqdm=False)[0]["token_ids"]
        assert again == expected[-1], case.describe()
    assert llm.is_finished() and not llm.sequences and not llm.finished, case.describe()
    assert llm.block_manager.num_used_blocks == 0, case.describe()
    shutil.rmtree(model_dir, ignore_errors=True)
    return case
