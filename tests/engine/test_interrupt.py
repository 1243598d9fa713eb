"""A KeyboardInterrupt that escapes `LLMEngine.step()` (Ctrl-C in a notebook) leaves an engine that goes on.

The oracle is the same requests on a fresh engine that was never interrupted:
after the interrupt the engine is stepped to the end, and every request must
get the same greedy tokens, the log must keep one STEP event per step number,
and each FINISHED must count exactly the tokens that were logged for it.
Under async scheduling the interrupt is raised while a step's tokens are
booked as placeholders (after `_advance`, inside the next launch).
"""
from __future__ import annotations

import pytest

from courseware.oracle import random_prompts
from reference import LLM, SamplingParams
from reference.engine.sequence import PENDING_TOKEN
from reference.metrics import check_lifecycle
from tests.helpers import events_of

VOCAB = 1024
PROMPT_LENS = [9, 23, 14]
MAX_TOKENS = [12, 9, 15]


def make_llm(model_dir: str, device: str, async_scheduling: bool) -> LLM:
    return LLM(model_dir, device=device, dtype="float32", max_model_len=256, num_kvcache_blocks=64,
               async_scheduling=async_scheduling)


def interrupt_once(obj, name: str, after: int) -> None:
    """Make obj.name raise KeyboardInterrupt on its (after+1)-th call only."""
    real, calls = getattr(obj, name), [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == after + 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    setattr(obj, name, interrupted)


def run_to_end(llm: LLM, prompts, interrupt: tuple[str, int] | None) -> dict[int, list[int]]:
    ids = [llm.add_request(p, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
           for p, n in zip(prompts, MAX_TOKENS)]
    if interrupt is not None:
        interrupt_once(llm.model_runner, *interrupt)
        with pytest.raises(KeyboardInterrupt):
            for _ in range(200):
                llm.step()
    for _ in range(200):
        if llm.is_finished():
            break
        llm.step()
    assert llm.is_finished()
    return {i: llm.finished[i].output_token_ids for i in ids}


@pytest.mark.parametrize("async_scheduling, method, after", [
    (False, "run", 3),                 # a decode step: its STEP event is written, then the interrupt
    (False, "run", 0),                 # the first prefill step
    (True, "launch_decode", 4),        # the previous step's tokens are placeholders when it strikes
    (True, "launch_prefill", 0),
])
def test_an_escaped_interrupt_keeps_the_log_true_and_the_tokens_unchanged(tiny_model_dir, device, async_scheduling,
                                                                        method, after):
    prompts = random_prompts(PROMPT_LENS, VOCAB, seed=11)
    expected = run_to_end(make_llm(tiny_model_dir, device, False), prompts, None)
    llm = make_llm(tiny_model_dir, device, async_scheduling)
    assert run_to_end(llm, prompts, (method, after)) == expected

    events = llm.log.events
    steps = [e["step"] for e in events_of(events, "STEP")]
    assert len(steps) == len(set(steps)), "a step number was used twice"
    for seq_id, tokens in expected.items():
        logged = [e["token_id"] for e in events if e["event"] in ("FIRST_TOKEN", "TOKEN") and e["seq_id"] == seq_id]
        assert logged == tokens
        (finished,) = events_of(events, "FINISHED", seq_id)
        assert finished["num_output_tokens"] == len(tokens)
    assert check_lifecycle(events, async_scheduling=async_scheduling) == []
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)


def test_requests_aborted_after_an_interrupt_count_only_real_tokens(tiny_model_dir, device):
    """`LLM.generate` aborts its requests when Ctrl-C escapes; under async scheduling a placeholder
    token was booked then, and FINISHED must not count it."""
    prompts = random_prompts(PROMPT_LENS, VOCAB, seed=12)
    llm = make_llm(tiny_model_dir, device, True)
    interrupt_once(llm.model_runner, "launch_decode", after=4)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True), use_tqdm=False)
    events = llm.log.events
    finished = events_of(events, "FINISHED")
    assert len(finished) == 3 and {e["reason"] for e in finished} == {"abort"}
    for e in finished:
        logged = [t for t in events if t["event"] in ("FIRST_TOKEN", "TOKEN") and t["seq_id"] == e["seq_id"]]
        assert e["num_output_tokens"] == len(logged) > 0
        assert all(t["token_id"] != PENDING_TOKEN for t in logged)
    steps = [e["step"] for e in events_of(events, "STEP")]
    assert len(steps) == len(set(steps))
    # The engine serves the next batch as a fresh one does.
    again = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    fresh = make_llm(tiny_model_dir, device, False).generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert [o["token_ids"] for o in again] == [o["token_ids"] for o in fresh]
    steps = [e["step"] for e in events_of(llm.log.events, "STEP")]
    assert len(steps) == len(set(steps))
