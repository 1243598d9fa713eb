"""Lab 1, part 2: latency metrics from a lifecycle log (`metrics.request_metrics`).

Every log here is written by hand with times chosen as exact binary fractions,
and every expected metric is worked out in the test by plain arithmetic from
the definitions (vLLM's metrics design, docs/design.md §2):

    queue time = first SCHEDULED - ARRIVED      TTFT = FIRST_TOKEN - ARRIVED
    TPOT = (FINISHED - FIRST_TOKEN) / (output tokens - 1)
    ITLs = gaps between consecutive token events    end-to-end = FINISHED - ARRIVED
"""
from __future__ import annotations

import pytest

from lab_diagnostics import assert_same_list

pytestmark = [pytest.mark.lab1, pytest.mark.covers("lab1.request_metrics")]


def ev(name: str, seq_id: int | None, step: int, time: float, **fields) -> dict:
    return {"event": name, "seq_id": seq_id, "step": step, "time": time, **fields}


def step_event(step: int, time: float) -> dict:
    """An engine STEP event: it belongs to no request and must not disturb any request's metrics."""
    return ev("STEP", None, step, time, is_prefill=step == 0, batch_size=1, num_tokens=1, num_running=1,
              num_waiting=0, kv_blocks_used=1, kv_blocks_total=8)


def simple_request(seq_id: int = 0) -> list[dict]:
    """Arrives at 1.0, waits until 1.5, three tokens at 2.0, 2.25 and 2.75, finishes at 2.75."""
    return [
        ev("ARRIVED", seq_id, 0, 1.0, prompt_len=5),
        ev("QUEUED", seq_id, 0, 1.0, reason="new"),
        ev("SCHEDULED", seq_id, 0, 1.5, is_prefill=True, num_new_tokens=5, num_cached_tokens=0, block_table=[0]),
        step_event(0, 1.5),
        ev("FIRST_TOKEN", seq_id, 0, 2.0, index=0, token_id=7),
        ev("SCHEDULED", seq_id, 1, 2.0, is_prefill=False, num_new_tokens=1, num_cached_tokens=5, block_table=[0]),
        step_event(1, 2.0),
        ev("TOKEN", seq_id, 1, 2.25, index=1, token_id=8),
        ev("SCHEDULED", seq_id, 2, 2.25, is_prefill=False, num_new_tokens=1, num_cached_tokens=6, block_table=[0]),
        step_event(2, 2.25),
        ev("TOKEN", seq_id, 2, 2.75, index=2, token_id=9),
        ev("FINISHED", seq_id, 2, 2.75, reason="length", num_output_tokens=3),
        ev("FREED", seq_id, 2, 2.75, blocks_freed=1),
    ]


def metrics_of(impl, events: list[dict]) -> dict:
    return impl.module("metrics").request_metrics(events)


def check_metric(name: str, got, expected, why: str) -> None:
    if expected is None:
        if got is not None:
            pytest.fail(f"{name}: expected None ({why}), got {got!r}", pytrace=False)
        return
    if got is None or got != pytest.approx(expected, abs=1e-12):
        pytest.fail(f"{name}: expected {expected!r} ({why}), got {got!r}", pytrace=False)


@pytest.mark.points(2)
def test_queue_time_and_ttft_start_at_arrival(impl):
    m = metrics_of(impl, simple_request())[0]
    check_metric("queue_time", m.queue_time, 1.5 - 1.0, "first SCHEDULED 1.5 - ARRIVED 1.0")
    check_metric("ttft", m.ttft, 2.0 - 1.0, "FIRST_TOKEN 2.0 - ARRIVED 1.0, not from SCHEDULED")


@pytest.mark.points(2)
def test_tpot_and_end_to_end(impl):
    m = metrics_of(impl, simple_request())[0]
    check_metric("tpot", m.tpot, (2.75 - 2.0) / (3 - 1), "(FINISHED 2.75 - FIRST_TOKEN 2.0) / (3 tokens - 1)")
    check_metric("e2e", m.e2e, 2.75 - 1.0, "FINISHED 2.75 - ARRIVED 1.0")
    if m.num_output_tokens != 3:
        pytest.fail(f"num_output_tokens: expected 3 (one FIRST_TOKEN + two TOKEN events), got {m.num_output_tokens}",
                    pytrace=False)
    if m.prompt_len != 5 or m.finish_reason != "length":
        pytest.fail(f"prompt_len/finish_reason: expected 5/'length' (from ARRIVED and FINISHED), "
                    f"got {m.prompt_len!r}/{m.finish_reason!r}", pytrace=False)


@pytest.mark.points(2)
def test_inter_token_latencies(impl):
    m = metrics_of(impl, simple_request())[0]
    assert_same_list("itls (gaps between consecutive token events 2.0, 2.25, 2.75)",
                     [0.25, 0.5], list(m.itls), label=lambda i: f"gap {i}")


@pytest.mark.points(2)
def test_preempted_request_measures_from_first_events(impl):
    """Queue time ends at the *first* SCHEDULED; the ITL across a preemption includes the wait."""
    log = [
        ev("ARRIVED", 3, 0, 0.0, prompt_len=4),
        ev("QUEUED", 3, 0, 0.0, reason="new"),
        ev("SCHEDULED", 3, 0, 0.5, is_prefill=True, num_new_tokens=4, num_cached_tokens=0, block_table=[2]),
        ev("FIRST_TOKEN", 3, 0, 1.0, index=0, token_id=1),
        ev("PREEMPTED", 3, 1, 1.25, blocks_freed=1),
        ev("QUEUED", 3, 1, 1.25, reason="preempted"),
        ev("SCHEDULED", 3, 3, 2.0, is_prefill=True, num_new_tokens=5, num_cached_tokens=0, block_table=[5, 6]),
        ev("TOKEN", 3, 3, 2.5, index=1, token_id=2),
        ev("FINISHED", 3, 3, 2.5, reason="length", num_output_tokens=2),
        ev("FREED", 3, 3, 2.5, blocks_freed=2),
    ]
    m = metrics_of(impl, log)[3]
    check_metric("queue_time", m.queue_time, 0.5 - 0.0, "the first SCHEDULED (0.5), not the re-prefill at 2.0")
    check_metric("ttft", m.ttft, 1.0, "FIRST_TOKEN 1.0 - ARRIVED 0.0")
    assert_same_list("itls (the gap across the preemption is what the user waited)", [2.5 - 1.0], list(m.itls))
    check_metric("tpot", m.tpot, (2.5 - 1.0) / (2 - 1), "(FINISHED - FIRST_TOKEN) / (2 tokens - 1)")
    if m.num_preemptions != 1:
        pytest.fail(f"num_preemptions: expected 1 (one PREEMPTED event), got {m.num_preemptions}", pytrace=False)


@pytest.mark.points(2)
def test_undefined_metrics_are_none(impl):
    """One token: no TPOT and no ITL. Still running: no e2e. Aborted while waiting: no queue time or TTFT."""
    one_token = [
        ev("ARRIVED", 0, 0, 0.0, prompt_len=3), ev("QUEUED", 0, 0, 0.0, reason="new"),
        ev("SCHEDULED", 0, 0, 0.25, is_prefill=True, num_new_tokens=3, num_cached_tokens=0, block_table=[0]),
        ev("FIRST_TOKEN", 0, 0, 0.5, index=0, token_id=4),
        ev("FINISHED", 0, 0, 0.5, reason="stop", num_output_tokens=1), ev("FREED", 0, 0, 0.5, blocks_freed=1),
    ]
    running = simple_request(1)[:8]   # ends after its second token: no FINISHED yet
    aborted = [
        ev("ARRIVED", 2, 0, 0.0, prompt_len=9), ev("QUEUED", 2, 0, 0.0, reason="new"),
        ev("FINISHED", 2, 1, 0.75, reason="abort", num_output_tokens=0), ev("FREED", 2, 1, 0.75, blocks_freed=0),
    ]
    metrics = metrics_of(impl, one_token + running + aborted)
    check_metric("tpot of a one-token request", metrics[0].tpot, None, "TPOT needs two tokens")
    assert_same_list("itls of a one-token request", [], list(metrics[0].itls))
    check_metric("ttft of a one-token request", metrics[0].ttft, 0.5, "FIRST_TOKEN 0.5 - ARRIVED 0.0")
    check_metric("e2e of a running request", metrics[1].e2e, None, "it has not FINISHED")
    check_metric("tpot of a running request", metrics[1].tpot, None, "it has not FINISHED")
    check_metric("ttft of a running request", metrics[1].ttft, 1.0, "FIRST_TOKEN 2.0 - ARRIVED 1.0")
    check_metric("queue_time of a request aborted while waiting", metrics[2].queue_time, None, "never SCHEDULED")
    check_metric("ttft of a request aborted while waiting", metrics[2].ttft, None, "no FIRST_TOKEN")
    check_metric("e2e of a request aborted while waiting", metrics[2].e2e, 0.75, "FINISHED 0.75 - ARRIVED 0.0")


@pytest.mark.points(2)
def test_interleaved_requests_are_measured_separately(impl):
    """Two requests whose events interleave, as they do in a real log, each get their own numbers."""
    a = simple_request(0)
    b = [dict(e, time=e["time"] + 0.125) if e["seq_id"] == 0 else e for e in simple_request(0)]
    b = [dict(e, seq_id=1) if e["seq_id"] is not None else e for e in b if e["event"] != "STEP"]
    log = sorted(a + b, key=lambda e: e["time"])   # stable: a's event first on ties
    metrics = metrics_of(impl, log)
    assert_same_list("request ids, in arrival order", [0, 1], list(metrics))
    for seq_id in (0, 1):
        m = metrics[seq_id]
        check_metric(f"seq {seq_id} ttft", m.ttft, 1.0, "both requests wait exactly 1.0 for their first token")
        check_metric(f"seq {seq_id} e2e", m.e2e, 1.75, "both requests take 1.75 end to end")
        assert_same_list(f"seq {seq_id} itls", [0.25, 0.5], list(m.itls))


@pytest.mark.points(1)
def test_queue_time_counts_from_arrival_when_queued_later(impl):
    """QUEUED may come after ARRIVED (the engine logs both, time passes in between): queue time starts at ARRIVED."""
    log = simple_request()
    log[1] = ev("QUEUED", 0, 0, 1.25, reason="new")
    m = metrics_of(impl, log)[0]
    check_metric("queue_time", m.queue_time, 1.5 - 1.0, "first SCHEDULED 1.5 - ARRIVED 1.0, not QUEUED 1.25")
    check_metric("ttft", m.ttft, 2.0 - 1.0, "FIRST_TOKEN 2.0 - ARRIVED 1.0")


@pytest.mark.points(1)
def test_tpot_of_a_two_token_request(impl):
    """Two tokens make one gap: TPOT is defined, and equals that gap."""
    log = simple_request()[:8] + [ev("FINISHED", 0, 1, 2.25, reason="length", num_output_tokens=2),
                                  ev("FREED", 0, 1, 2.25, blocks_freed=1)]
    m = metrics_of(impl, log)[0]
    check_metric("tpot", m.tpot, (2.25 - 2.0) / (2 - 1), "(FINISHED 2.25 - FIRST_TOKEN 2.0) / (2 tokens - 1)")


@pytest.mark.points(1)
def test_output_tokens_are_counted_from_token_events(impl):
    """A request still decoding has no FINISHED yet: its output tokens are its token events (FIRST_TOKEN + TOKENs)."""
    log = simple_request(3)[:11]     # three tokens (2.0, 2.25, 2.75), FINISHED not logged yet
    m = metrics_of(impl, log)[3]
    if m.num_output_tokens != 3:
        pytest.fail(f"num_output_tokens of a request still running: expected 3 (FIRST_TOKEN and two TOKENs), got "
                    f"{m.num_output_tokens!r}", pytrace=False)
    assert_same_list("itls of a request still running", [0.25, 0.5], list(m.itls))
    check_metric("e2e of a request still running", m.e2e, None, "it has not FINISHED")


@pytest.mark.points(1)
def test_prompt_len_comes_from_arrived_even_after_a_prefix_hit(impl):
    """A 6-token prompt whose first 4 tokens hit the prefix cache: its first SCHEDULED computes only 2
    (num_new_tokens=2, num_cached_tokens=4). prompt_len is the prompt's length, which ARRIVED carries."""
    log = [
        ev("ARRIVED", 0, 0, 0.0, prompt_len=6), ev("QUEUED", 0, 0, 0.0, reason="new"),
        ev("SCHEDULED", 0, 0, 0.25, is_prefill=True, num_new_tokens=2, num_cached_tokens=4, block_table=[3, 7]),
        ev("FIRST_TOKEN", 0, 0, 0.5, index=0, token_id=9),
        ev("FINISHED", 0, 0, 0.5, reason="length", num_output_tokens=1), ev("FREED", 0, 0, 0.5, blocks_freed=2),
    ]
    m = metrics_of(impl, log)[0]
    if m.prompt_len != 6:
        pytest.fail(f"prompt_len: expected 6 (ARRIVED's prompt_len; the first SCHEDULED computed only the 2 tokens "
                    f"the prefix cache did not hold), got {m.prompt_len!r}", pytrace=False)


@pytest.mark.points(1)
def test_tpot_of_a_request_aborted_after_two_tokens(impl):
    """Aborted after its second token: FINISHED (reason abort) is the abort's moment, 1.75, and TPOT ends there
    as for any finished request (the handout's table): (1.75 - 0.5) / (2 - 1), counting the wait after the last
    token. Its last token at 1.0 is not where TPOT ends."""
    log = [
        ev("ARRIVED", 0, 0, 0.0, prompt_len=3), ev("QUEUED", 0, 0, 0.0, reason="new"),
        ev("SCHEDULED", 0, 0, 0.25, is_prefill=True, num_new_tokens=3, num_cached_tokens=0, block_table=[0]),
        ev("FIRST_TOKEN", 0, 0, 0.5, index=0, token_id=4),
        ev("SCHEDULED", 0, 1, 0.75, is_prefill=False, num_new_tokens=1, num_cached_tokens=3, block_table=[0]),
        ev("TOKEN", 0, 1, 1.0, index=1, token_id=5),
        ev("FINISHED", 0, 3, 1.75, reason="abort", num_output_tokens=2), ev("FREED", 0, 3, 1.75, blocks_freed=1),
    ]
    m = metrics_of(impl, log)[0]
    check_metric("tpot of a request aborted after two tokens", m.tpot, (1.75 - 0.5) / (2 - 1),
                 "(FINISHED 1.75, the abort - FIRST_TOKEN 0.5) / (2 tokens - 1)")
    check_metric("e2e of a request aborted after two tokens", m.e2e, 1.75, "FINISHED 1.75 - ARRIVED 0.0")
    assert_same_list("itls of a request aborted after two tokens", [0.5], list(m.itls))
