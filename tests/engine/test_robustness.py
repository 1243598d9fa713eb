"""One bad request never poisons the engine (issue: engine robustness).

Each test reproduces one defect found by trying the engine as a new user
would, and then checks that the same LLM still serves a normal request with
transformers' tokens.
"""
from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest

from reference import LLM, SamplingParams
from courseware.oracle import hf_greedy, random_prompts

GOOD = [5, 6, 7, 8, 9, 10, 11]
MAX_NEW = 12


def make_llm(model_dir: str, device: str, **config) -> LLM:
    return LLM(model_dir, device=device, dtype="float32", num_kvcache_blocks=64, max_model_len=256, **config)


def assert_serves(llm: LLM, model_dir: str) -> None:
    """The engine is idle, holds no blocks, and a normal request gets transformers' tokens."""
    assert llm.is_finished() and not llm.sequences and not llm.finished
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)
    out = llm.generate([GOOD], SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out["token_ids"] == hf_greedy(model_dir, GOOD, MAX_NEW)
    assert not llm.finished


@pytest.fixture
def llm(tiny_model_dir, device):
    return make_llm(tiny_model_dir, device)


def copy_model(src: str, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def edit_json(path, **fields) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


# -- 1. sampling parameters that cannot give a distribution ---------------------

@pytest.mark.parametrize("field, value", [("temperature", float("nan")), ("temperature", float("inf")),
                                          ("top_p", float("nan"))])
def test_non_finite_sampling_numbers_are_refused(llm, tiny_model_dir, field, value):
    with pytest.raises(ValueError, match=f"{field}.*finite"):
        SamplingParams(**{field: value})
    params = SamplingParams()
    setattr(params, field, value)      # changed after construction: the engine checks again
    with pytest.raises(ValueError, match="prompt 0: .*finite"):
        llm.generate([GOOD], params, use_tqdm=False)
    assert_serves(llm, tiny_model_dir)


def test_tiny_temperature_samples_as_greedy(llm, tiny_model_dir):
    # logits / 1e-38 overflows fp32: the request is served as the greedy one it nearly is.
    out = llm.generate([GOOD], SamplingParams(temperature=1e-38, max_tokens=MAX_NEW, ignore_eos=True, seed=3),
                       use_tqdm=False)[0]
    assert out["finish_reason"] == "length"
    assert out["token_ids"] == hf_greedy(tiny_model_dir, GOOD, MAX_NEW)
    assert_serves(llm, tiny_model_dir)


def test_top_p_that_rounds_to_zero_keeps_the_most_likely_token(llm, tiny_model_dir):
    # 1e-46 is 0 in fp32, which used to mask every token; the nucleus always holds the top token.
    out = llm.generate([GOOD], SamplingParams(temperature=1.0, top_p=1e-46, max_tokens=MAX_NEW, ignore_eos=True,
                                              seed=3), use_tqdm=False)[0]
    assert out["token_ids"] == hf_greedy(tiny_model_dir, GOOD, MAX_NEW)
    assert_serves(llm, tiny_model_dir)


# -- 1. a failure inside a step ---------------------------------------------------

def _fail_once(obj, name: str, after: int = 0):
    """Make obj.name raise on its (after+1)-th call only."""
    real = getattr(obj, name)
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == after + 1:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return real(*args, **kwargs)
    setattr(obj, name, flaky)


@pytest.mark.parametrize("async_scheduling, failing, after", [(False, "run", 3), (True, "launch_decode", 3),
                                                              (True, "launch_prefill", 0)])
def test_failed_step_fails_its_requests_and_the_engine_goes_on(tiny_model_dir, device, async_scheduling, failing,
                                                               after):
    llm = make_llm(tiny_model_dir, device, async_scheduling=async_scheduling)
    runner = llm.model_runner
    _fail_once(runner, failing, after=after)
    prompts = random_prompts([9, 17], 1000, seed=4)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
                        use_tqdm=False)
    assert [o["finish_reason"] for o in outs] == ["error", "error"]
    assert all("inf, nan" in o["error"] for o in outs)
    finished = [e for e in llm.log.events if e["event"] == "FINISHED"]
    assert [e["reason"] for e in finished] == ["error", "error"]
    assert_serves(llm, tiny_model_dir)


def test_failed_step_spares_requests_outside_its_batch(llm, tiny_model_dir):
    # The second request arrives later: the failing prefill step holds only it.
    first = llm.add_request(GOOD, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))
    llm.step()
    _fail_once(llm.model_runner, "run")
    second = llm.add_request([3, 4, 5], SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))
    llm.step()
    assert llm.finished[second].finish_reason == "error"
    while not llm.is_finished():
        llm.step()
    assert llm.finished.pop(first).output_token_ids == hf_greedy(tiny_model_dir, GOOD, MAX_NEW)
    llm.finished.clear()
    assert_serves(llm, tiny_model_dir)


# -- 2. streams own their requests ------------------------------------------------

def test_abandoned_streams_free_their_blocks(llm, tiny_model_dir):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for how in ("break", "close", "gc", "break", "close"):
        stream = llm.stream(random_prompts([30, 31], 1000, seed=9), params)
        next(stream)
        assert llm.block_manager.num_used_blocks > 0
        if how == "close":
            stream.close()
        elif how == "gc":
            del stream
            gc.collect()
        else:
            for _ in stream:
                break
            del stream
        assert llm.block_manager.num_used_blocks == 0, f"{how}: blocks still held"
        assert not llm.sequences and not llm.finished
    assert_serves(llm, tiny_model_dir)


def _collect(stream) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = {}
    for chunk in stream:
        tokens.setdefault(chunk.index, []).extend(chunk.token_ids)
    return tokens


def test_interleaved_streams_each_get_their_own_tokens(llm, tiny_model_dir):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    a_prompts, b_prompts = random_prompts([8, 20], 1000, seed=1), random_prompts([13], 1000, seed=2)
    a, b = llm.stream(a_prompts, params), llm.stream(b_prompts, params)
    got = {"a": {}, "b": {}}
    live = {"a": a, "b": b}
    while live:                       # alternate one chunk from each until both end
        for name, stream in list(live.items()):
            chunk = next(stream, None)
            if chunk is None:
                del live[name]
            else:
                got[name].setdefault(chunk.index, []).extend(chunk.token_ids)
    assert got["a"] == {i: hf_greedy(tiny_model_dir, p, MAX_NEW) for i, p in enumerate(a_prompts)}
    assert got["b"] == {0: hf_greedy(tiny_model_dir, b_prompts[0], MAX_NEW)}
    assert_serves(llm, tiny_model_dir)


def test_generate_inside_a_stream_loop(llm, tiny_model_dir):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outer = random_prompts([15], 1000, seed=5)[0]
    streamed, inner_results = [], []
    for chunk in llm.stream([outer], params):
        streamed += chunk.token_ids
        if len(inner_results) < 2:
            inner_results.append(llm.generate([GOOD], params, use_tqdm=False)[0]["token_ids"])
    assert streamed == hf_greedy(tiny_model_dir, outer, MAX_NEW)
    assert inner_results == [hf_greedy(tiny_model_dir, GOOD, MAX_NEW)] * 2
    assert_serves(llm, tiny_model_dir)


# -- 3. stop rules as transformers applies them ------------------------------------

def test_every_eos_id_of_generation_config_stops(tiny_model_dir, device, tmp_path):
    model_dir = copy_model(tiny_model_dir, tmp_path / "m")
    prompt = random_prompts([12], 1000, seed=11)[0]
    free_run = hf_greedy(model_dir, prompt, 30)
    second_eos = free_run[5]
    config_eos = json.loads((tmp_path / "m" / "config.json").read_text())["eos_token_id"]
    edit_json(tmp_path / "m" / "generation_config.json", eos_token_id=[config_eos, second_eos])
    hf_model_dir = copy_model(model_dir, tmp_path / "oracle")   # a fresh path: the oracle caches models by path
    expected = hf_greedy(hf_model_dir, prompt, 30, stop_at_eos=True)
    assert expected == free_run[:free_run.index(second_eos) + 1]   # transformers stops there, keeping the token
    llm = make_llm(model_dir, device)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=30), use_tqdm=False)[0]
    assert out["token_ids"] == expected and out["finish_reason"] == "stop"
    ignored = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
                           use_tqdm=False)[0]
    assert ignored["token_ids"] == free_run and ignored["finish_reason"] == "length"


def test_eos_list_in_config_json_without_generation_config(tiny_model_dir, device, tmp_path):
    model_dir = copy_model(tiny_model_dir, tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").unlink()
    prompt = random_prompts([12], 1000, seed=12)[0]
    free_run = hf_greedy(model_dir, prompt, 30)
    stop = free_run[3]
    edit_json(tmp_path / "m" / "config.json", eos_token_id=[1023, stop])
    expected = hf_greedy(copy_model(model_dir, tmp_path / "oracle"), prompt, 30, stop_at_eos=True)
    assert expected == free_run[:free_run.index(stop) + 1]
    out = make_llm(model_dir, device).generate([prompt], SamplingParams(temperature=0.0, max_tokens=30),
                                               use_tqdm=False)[0]
    assert out["token_ids"] == expected


# -- 4. loading and batch validation ----------------------------------------------

def test_other_architecture_is_refused(tiny_model_dir, tmp_path):
    model_dir = copy_model(tiny_model_dir, tmp_path / "m")
    edit_json(tmp_path / "m" / "config.json", architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(ValueError, match="LlamaForCausalLM.*Qwen3"):
        LLM(model_dir, device="cpu")


@pytest.mark.parametrize("fields, problem", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"layer_types": ["full_attention", "sliding_attention"], "use_sliding_window": True, "sliding_window": 8},
     r"sliding-window attention in layers \[1\]"),
    ({"layer_types": None, "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0},
     r"sliding-window attention in layers \[0, 1\]"),
])
def test_qwen3_variant_the_model_does_not_implement_is_refused(tiny_model_dir, tmp_path, fields, problem):
    """A SiLU-less or sliding-window Qwen3 loads weight by weight and would generate other tokens than transformers."""
    model_dir = copy_model(tiny_model_dir, tmp_path / "m")
    edit_json(tmp_path / "m" / "config.json", **fields)
    with pytest.raises(ValueError, match=problem):
        LLM(model_dir, device="cpu")


def test_sliding_window_settings_that_slide_no_layer_are_accepted(tiny_model_dir, tmp_path):
    """As released Qwen3 configs have them: a window size with use_sliding_window off, or every layer below
    max_window_layers."""
    layers = json.loads((Path(tiny_model_dir) / "config.json").read_text())["num_hidden_layers"]
    for i, fields in enumerate(({"layer_types": None, "use_sliding_window": False, "sliding_window": 8},
                                {"layer_types": None, "use_sliding_window": True, "sliding_window": 8,
                                 "max_window_layers": layers})):
        model_dir = copy_model(tiny_model_dir, tmp_path / f"m{i}")   # a path of its own: the oracle caches by path
        edit_json(tmp_path / f"m{i}" / "config.json", **fields)
        assert_serves(LLM(model_dir, device="cpu"), model_dir)


def test_folder_without_tokenizer_is_refused(tiny_model_dir, tmp_path):
    model_dir = copy_model(tiny_model_dir, tmp_path / "m")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / "m" / name).unlink()
    with pytest.raises(ValueError, match="no tokenizer files"):
        LLM(model_dir, device="cpu")


def test_corrupt_safetensors_error_names_the_file(tiny_model_dir, tmp_path):
    model_dir = copy_model(tiny_model_dir, tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="model.safetensors: cannot load weights"):
        LLM(model_dir, device="cpu")


def test_batch_with_a_bad_later_prompt_queues_nothing(llm, tiny_model_dir):
    huge_seed = SamplingParams(max_tokens=4)
    huge_seed.seed = 2**64                     # set after construction, as a caller might
    for params, pattern in ((huge_seed, "prompt 1: .*seed"),
                            (SamplingParams(max_tokens=4, stop_token_ids=[10**6]), "prompt 1: .*vocabulary")):
        with pytest.raises(ValueError, match=pattern):
            llm.generate([GOOD, GOOD], [SamplingParams(max_tokens=4), params], use_tqdm=False)
        assert not llm.sequences and not llm.scheduler.waiting
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**63)
    assert_serves(llm, tiny_model_dir)


# -- 5. idle after generate ---------------------------------------------------------

def test_async_generate_returns_with_nothing_in_flight(tiny_model_dir, device):
    prompt = random_prompts([10], 1000, seed=13)[0]
    stop = hf_greedy(tiny_model_dir, prompt, MAX_NEW)[6]
    llm = make_llm(tiny_model_dir, device, async_scheduling=True)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_NEW, stop_token_ids=[stop]),
                       use_tqdm=False)[0]
    assert out["finish_reason"] == "stop"
    assert llm.is_finished(), "a discarded step is still in flight after generate returned"
    assert_serves(llm, tiny_model_dir)
