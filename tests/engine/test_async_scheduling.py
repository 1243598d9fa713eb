"""Async scheduling (`async_scheduling=True`): the CPU schedules step k+1 while step k computes.

The oracle is the same engine run synchronously: greedy tokens and finish
reasons must be equal request by request, whatever the workload makes the
overlapped path do (launch prefill steps too, fall back where a preemption may come, throw away the extra
token of a request that sampled a stop token, hold back one that reaches its
length limit). On the CPU the "device" work is synchronous, but every piece of
bookkeeping runs; `--device cuda` runs the same tests with CUDA graphs.
"""
from __future__ import annotations

import pytest

from reference import LLM, SamplingParams
from reference.engine.sequence import PENDING_TOKEN
from reference.metrics import check_lifecycle
from courseware.oracle import random_prompts
from tests.helpers import events_of

VOCAB = 1024


def make_llm(model_dir: str, device: str, async_scheduling: bool, **overrides) -> LLM:
    fields = dict(device=device, dtype="float32", max_model_len=256, num_kvcache_blocks=64)
    fields.update(overrides)
    return LLM(model_dir, async_scheduling=async_scheduling, **fields)


def results(llm: LLM, prompts, params) -> list[tuple[list[int], str]]:
    return [(r["token_ids"], r["finish_reason"]) for r in llm.generate(prompts, params, use_tqdm=False)]


def assert_clean_end(llm: LLM) -> None:
    """Nothing in flight, every block back, a legal log, no placeholder left behind."""
    assert llm.is_finished() and llm._in_flight is None
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)
    assert check_lifecycle(llm.log.events, async_scheduling=True) == []
    assert all(e["token_id"] != PENDING_TOKEN for e in llm.log.events if e["event"] in ("TOKEN", "FIRST_TOKEN"))


def count_calls(llm: LLM, name: str) -> list[int]:
    """Wrap a model-runner method to count its calls (the wrapped method still runs)."""
    calls = [0]
    original = getattr(llm.model_runner, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)
    setattr(llm.model_runner, name, counted)
    return calls


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


SCENARIOS = {
    # name: (prompt lengths, max_tokens per prompt, engine overrides)
    "plain": ([5, 17, 33, 8, 60, 21, 2, 44], [12, 30, 7, 25, 18, 1, 40, 9], {}),
    "preemption": ([40, 52, 61, 47, 35, 58], [60] * 6, dict(num_kvcache_blocks=22)),
    "chunked_prefill": ([90, 120, 33, 70], [20, 35, 15, 28],
                        dict(enable_chunked_prefill=True, max_num_batched_tokens=32)),
    "few_seats": ([10, 20, 30, 40, 50, 15, 25], [15, 22, 9, 30, 12, 18, 26], dict(max_num_seqs=3)),
    # Fewer decode slots per step (the token budget) than running requests: some wait a step while running.
    "decode_budget": ([9, 14, 6, 11, 8, 12], [20, 9, 16, 25, 11, 14],
                      dict(enable_chunked_prefill=True, max_num_batched_tokens=4)),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_same_tokens_as_synchronous_engine(tiny_model_dir, device, scenario):
    lengths, max_tokens, overrides = SCENARIOS[scenario]
    prompts = random_prompts(lengths, VOCAB, seed=11)
    params = [greedy(n, ignore_eos=True) for n in max_tokens]
    expected = results(make_llm(tiny_model_dir, device, False, **overrides), prompts, params)
    llm = make_llm(tiny_model_dir, device, True, **overrides)
    launched = count_calls(llm, "launch_decode")
    assert results(llm, prompts, params) == expected
    assert launched[0] > 0, "the overlapped path never ran"
    assert_clean_end(llm)
    if scenario == "preemption":
        assert events_of(llm.log.events, "PREEMPTED"), "the workload is meant to preempt"


def test_stop_tokens_throw_away_one_extra_token(tiny_model_dir, device):
    """A request that samples a stop token was already scheduled once more: that token is dropped."""
    prompts = random_prompts([7, 19, 26, 12, 31, 9], VOCAB, seed=5)
    sync_llm = make_llm(tiny_model_dir, device, False)
    free_run = results(sync_llm, prompts, [greedy(40, ignore_eos=True)] * len(prompts))
    # Stop tokens taken from the middle of what the requests would generate, so several stop early.
    stops = sorted({ids[k] for ids, _ in free_run for k in (3, 9)})[:4]
    params = [greedy(40, stop_token_ids=stops)] * len(prompts)
    expected = results(make_llm(tiny_model_dir, device, False), prompts, params)
    assert any(reason == "stop" for _, reason in expected), "the stop tokens are meant to stop someone"
    llm = make_llm(tiny_model_dir, device, True)
    assert results(llm, prompts, params) == expected
    assert_clean_end(llm)


def count_sampled_launches(llm: LLM) -> list[int]:
    """Count the overlapped decode steps whose batch holds a sampled (non-greedy) request."""
    calls = [0]
    original = llm.model_runner.launch_decode

    def counted(seqs, previous):
        calls[0] += any(not seq.sampling_params.greedy for seq in seqs)
        return original(seqs, previous)
    llm.model_runner.launch_decode = counted
    return calls


def test_greedy_and_sampled_requests_overlap_and_keep_their_seeds(tiny_model_dir, device):
    prompts = random_prompts([8, 15, 23, 30], VOCAB, seed=3)
    params = [greedy(20, ignore_eos=True), SamplingParams(temperature=0.8, top_p=0.9, seed=4, max_tokens=14,
                                                          ignore_eos=True),
              greedy(25, ignore_eos=True), SamplingParams(temperature=1.0, top_k=20, seed=9, max_tokens=6,
                                                          ignore_eos=True)]
    expected = results(make_llm(tiny_model_dir, device, False), prompts, params)
    llm = make_llm(tiny_model_dir, device, True)
    sampled_launches = count_sampled_launches(llm)
    assert results(llm, prompts, params) == expected
    assert sampled_launches[0] > 0, "batches with sampled requests should overlap too"
    assert_clean_end(llm)


def sampled(max_tokens: int, k: int, **kw) -> SamplingParams:
    """The k-th of a few sampling settings (temperature, top-k, top-p, both), seeded with k."""
    settings = [dict(temperature=0.7), dict(temperature=1.0, top_k=20), dict(temperature=0.9, top_p=0.8),
                dict(temperature=1.3, top_k=50, top_p=0.95)]
    return SamplingParams(max_tokens=max_tokens, seed=k, **settings[k % len(settings)], **kw)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_sampled_requests_same_tokens_as_synchronous_engine(tiny_model_dir, device, scenario):
    """Every request sampled with its own seed: the overlapped engine draws the synchronous engine's tokens."""
    lengths, max_tokens, overrides = SCENARIOS[scenario]
    prompts = random_prompts(lengths, VOCAB, seed=13)
    params = [sampled(n, k, ignore_eos=True) for k, n in enumerate(max_tokens)]
    expected = results(make_llm(tiny_model_dir, device, False, **overrides), prompts, params)
    llm = make_llm(tiny_model_dir, device, True, **overrides)
    sampled_launches = count_sampled_launches(llm)
    assert results(llm, prompts, params) == expected
    assert sampled_launches[0] > 0, "the overlapped path never ran"
    assert_clean_end(llm)


def test_sampled_requests_without_seeds_and_with_stop_tokens(tiny_model_dir, device):
    """Unseeded requests take their seeds from the engine's seed in arrival order; a sampled stop token
    ends a request one step before the overlapped engine notices, and the extra draw is thrown away."""
    prompts = random_prompts([7, 19, 26, 12, 31, 9], VOCAB, seed=5)
    free_run = results(make_llm(tiny_model_dir, device, False), prompts,
                       [SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True)] * len(prompts))
    stops = sorted({ids[k] for ids, _ in free_run for k in (4, 11)})[:4]
    params = [SamplingParams(temperature=0.8, top_k=40, max_tokens=30, stop_token_ids=stops)] * len(prompts)
    expected = results(make_llm(tiny_model_dir, device, False), prompts, params)
    assert any(reason == "stop" for _, reason in expected), "the stop tokens are meant to stop someone"
    llm = make_llm(tiny_model_dir, device, True)
    sampled_launches = count_sampled_launches(llm)
    assert results(llm, prompts, params) == expected
    assert sampled_launches[0] > 0
    assert_clean_end(llm)


@pytest.mark.parametrize("top_k, top_p, temperature", [(0, 1.0, 1.0), (20, 1.0, 0.7), (0, 0.9, 1.2), (50, 0.8, 0.5)])
def test_device_sampler_is_torch_multinomial_on_the_cpu(top_k, top_p, temperature):
    """On the CPU, the sampler that needs no read-back draws exactly what torch.multinomial draws
    from the same generator state: sampled outputs made before it are unchanged."""
    import torch

    from reference.layers.sampler import filter_top_k_top_p, sample_row
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    for seed in range(5):
        logits = torch.randn(2000, generator=torch.Generator().manual_seed(100 + seed)) * 4
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(4):
            probs = torch.softmax(filter_top_k_top_p(logits / temperature, top_k, top_p), dim=-1)
            assert int(sample_row(logits, params, ours)) == int(torch.multinomial(probs, 1, generator=theirs))


def test_a_row_that_cannot_be_sampled_raises_as_multinomial_does():
    import torch

    from reference.layers.sampler import INVALID_PROBABILITIES, sample, sample_on_device
    logits = torch.randn(3, 100)
    logits[1, 7] = float("nan")
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=1), SamplingParams(seed=2)]
    generators = [None, torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    tokens = sample_on_device(logits, params, generators).tolist()
    assert tokens[1] == -1 and tokens[0] >= 0 and tokens[2] >= 0
    with pytest.raises(RuntimeError, match="inf"):
        sample(logits, params, generators)
    assert "inf" in INVALID_PROBABILITIES


def test_requests_arriving_mid_run(tiny_model_dir, device):
    """New requests force a synchronous read-back (a prefill comes), then overlap resumes."""
    prompts = random_prompts([12, 25, 40, 9, 33], VOCAB, seed=8)
    max_tokens = [30, 22, 15, 28, 10]

    def run(async_scheduling: bool) -> dict[int, tuple[list[int], str]]:
        llm = make_llm(tiny_model_dir, device, async_scheduling)
        ids = [llm.add_request(p, greedy(n, ignore_eos=True)) for p, n in zip(prompts[:2], max_tokens[:2])]
        for step in range(40):
            if step in (4, 9, 13):
                k = len(ids)
                ids.append(llm.add_request(prompts[k], greedy(max_tokens[k], ignore_eos=True)))
            if llm.is_finished():
                break
            llm.step()
        while not llm.is_finished():
            llm.step()
        if async_scheduling:
            assert_clean_end(llm)
        return {i: (llm.finished[i].output_token_ids, llm.finished[i].finish_reason) for i in ids}
    assert run(True) == run(False)


def test_abort_while_a_step_is_in_flight(tiny_model_dir, device):
    prompts = random_prompts([14, 22, 31], VOCAB, seed=6)
    params = [greedy(30, ignore_eos=True)] * 3
    expected = results(make_llm(tiny_model_dir, device, False), prompts, params)
    llm = make_llm(tiny_model_dir, device, True)
    ids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    for _ in range(6):
        llm.step()
    assert llm._in_flight is not None and any(s.seq_id == ids[1] for s in llm._in_flight.seqs)
    llm.abort_request(ids[1])
    while not llm.is_finished():
        llm.step()
    assert_clean_end(llm)
    aborted = llm.finished[ids[1]]
    assert aborted.finish_reason == "abort"
    assert PENDING_TOKEN not in aborted.token_ids
    assert aborted.output_token_ids == expected[1][0][:aborted.num_output_tokens]
    for k in (0, 2):
        assert (llm.finished[ids[k]].output_token_ids, llm.finished[ids[k]].finish_reason) == expected[k]


def test_prefill_steps_are_launched_in_flight_too(tiny_model_dir, device):
    """Several prefill steps in a row (a small token budget): none runs synchronously, tokens as in sync mode."""
    lengths, max_tokens, overrides = SCENARIOS["plain"]
    overrides = dict(overrides, max_num_batched_tokens=110, max_model_len=110)
    prompts = random_prompts(lengths, VOCAB, seed=5)
    params = [greedy(n, ignore_eos=True) for n in max_tokens]
    expected = results(make_llm(tiny_model_dir, device, False, **overrides), prompts, params)
    llm = make_llm(tiny_model_dir, device, True, **overrides)
    sync_steps, prefills = count_calls(llm, "run"), count_calls(llm, "launch_prefill")
    assert results(llm, prompts, params) == expected
    assert prefills[0] >= 3 and sync_steps[0] == 0, f"{prefills[0]} prefills in flight, {sync_steps[0]} sync steps"
    assert_clean_end(llm)


def test_tokens_are_logged_one_step_late(tiny_model_dir, device):
    """With every request admitted at once, each token is logged exactly one step later than in sync mode.

    First tokens too: the prefill step is launched without waiting as well.
    """
    prompts = random_prompts([6, 18, 27, 11], VOCAB, seed=2)
    params = [greedy(n, ignore_eos=True) for n in (9, 16, 5, 12)]

    def token_events(async_scheduling: bool) -> dict[tuple[int, int], tuple[int, int]]:
        llm = make_llm(tiny_model_dir, device, async_scheduling)
        llm.generate(prompts, params, use_tqdm=False)
        return {(e["seq_id"], e["index"]): (e["step"], e["token_id"])
                for e in llm.log.events if e["event"] in ("TOKEN", "FIRST_TOKEN")}
    sync_events, async_events = token_events(False), token_events(True)
    assert async_events.keys() == sync_events.keys()
    for key, (step, token) in sync_events.items():
        assert async_events[key] == (step + 1, token), key


def test_stream_gives_the_same_text(tiny_model_dir, device):
    prompts = random_prompts([10, 24, 16], VOCAB, seed=12)
    params = [greedy(n, ignore_eos=True) for n in (18, 7, 25)]

    def streamed(async_scheduling: bool) -> dict[int, tuple[str, list[int]]]:
        llm = make_llm(tiny_model_dir, device, async_scheduling)
        text: dict[int, str] = {}
        ids: dict[int, list[int]] = {}
        for chunk in llm.stream(prompts, params):
            text[chunk.index] = text.get(chunk.index, "") + chunk.text
            ids.setdefault(chunk.index, []).extend(chunk.token_ids)
        return {i: (text[i], ids[i]) for i in text}
    assert streamed(True) == streamed(False)


def test_async_scheduling_must_be_a_bool(tiny_model_dir):
    with pytest.raises(TypeError, match="async_scheduling"):
        LLM(tiny_model_dir, device="cpu", async_scheduling="yes")


def test_length_limit_retires_through_the_scheduler(tiny_model_dir, device):
    """A request that the token in flight takes to its length limit leaves `running` by `Scheduler.retire`."""
    prompts = random_prompts([6, 13, 21], VOCAB, seed=12)
    params = [greedy(n, ignore_eos=True) for n in (9, 17, 5)]
    expected = results(make_llm(tiny_model_dir, device, False), prompts, params)
    llm = make_llm(tiny_model_dir, device, True)
    retired = []
    real_retire = llm.scheduler.retire

    def retire(seq):
        assert seq in llm.scheduler.running and not seq.is_finished
        retired.append(seq.seq_id)
        real_retire(seq)
        assert seq not in llm.scheduler.running
    llm.scheduler.retire = retire
    assert results(llm, prompts, params) == expected
    assert retired, "the overlapped path should retire requests at their length limit"
    assert_clean_end(llm)
