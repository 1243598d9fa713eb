"""Full garbage collections wait while a batch runs (reference/engine/collector.py).

The collector's generations are observed through `gc.callbacks`, so each check
sees what CPython actually collected; a control without the deferral shows that
the same allocations do reach the oldest generation, so the checks can fail.
"""
from __future__ import annotations

import gc
import weakref

import pytest

from reference.engine.collector import NEVER, full_collections_deferred

RETAINED = 200_000   # tracked containers kept alive, like a long batch's lifecycle log (at least)


@pytest.fixture
def generational_gc():
    """CPython's default thresholds and a frozen heap, so the oldest generation starts nearly empty.

    Yields (the generations collected, how many containers to keep). CPython starts a full
    collection only once the containers promoted since the last one exceed a quarter of the
    heap that one left behind, which freezing does not reset; so the count is scaled to the heap
    this process already holds (a test worker that ran other files first holds millions).
    """
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    if gc.get_threshold()[2] != 10:
        gc.set_threshold(*saved)
        pytest.skip("this CPython's collector is incremental: there is no full collection to defer")
    gc.collect()
    retained = max(RETAINED, len(gc.get_objects()))
    gc.freeze()
    collected: list[int] = []

    def record(phase, info):
        if phase == "stop":
            collected.append(info["generation"])
    gc.callbacks.append(record)
    try:
        yield collected, retained
    finally:
        gc.callbacks.remove(record)
        gc.unfreeze()
        gc.set_threshold(*saved)


class Node:
    def __init__(self):
        self.me = self   # a reference cycle: only the cyclic collector can free it


def test_without_deferral_the_same_allocations_reach_the_oldest_generation(generational_gc):
    collected, retained = generational_gc
    kept = [[i] for i in range(retained)]
    assert 2 in collected, "control: keeping this many containers should trigger a full collection"
    del kept


def test_full_collections_wait_inside_but_young_cycles_are_still_freed(generational_gc):
    collected, retained = generational_gc
    with full_collections_deferred():
        assert gc.get_threshold() == (700, 10, NEVER)
        cycle = Node()
        freed = weakref.ref(cycle)
        del cycle
        kept = [[i] for i in range(retained)]
        assert freed() is None, "a cycle dropped during the batch must still be freed by a young collection"
    assert 0 in collected and 2 not in collected, f"generations collected: {set(collected)}"
    assert gc.get_threshold() == (700, 10, 10)
    del kept


def test_thresholds_come_back_after_an_error():
    saved = gc.get_threshold()
    with pytest.raises(RuntimeError):
        with full_collections_deferred():
            raise RuntimeError("a step failed")
    assert gc.get_threshold() == saved


def test_generate_runs_its_batch_with_full_collections_deferred(tiny_model_dir, monkeypatch):
    from reference import LLM, SamplingParams
    llm = LLM(tiny_model_dir, device="cpu", max_model_len=64, max_num_seqs=4)
    seen: list[tuple[int, int, int]] = []
    step = llm.step

    def spying_step():
        seen.append(gc.get_threshold())
        return step()
    monkeypatch.setattr(llm, "step", spying_step)
    before = gc.get_threshold()
    out = llm.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                       use_tqdm=False)
    assert [len(o["token_ids"]) for o in out] == [4, 4]
    assert seen and all(t[2] == NEVER for t in seen), f"thresholds seen inside steps: {set(seen)}"
    assert gc.get_threshold() == before
