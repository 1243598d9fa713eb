"""Failure messages in the terms of the labs.

A bare `assert a == b` on a list of 40 events or a 3x8 block table makes a
student diff two walls of numbers. Each helper here finds the *first* place
where the result differs from what was expected and prints it with its
neighbours, named the way the lab names things: the lifecycle event and its
step, the sequence and block index, the token position and its slot.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

CONTEXT = 2   # neighbours shown on each side of the first difference


def first_difference(expected: Sequence[Any], actual: Sequence[Any]) -> int | None:
    """Index of the first differing entry (or of the first extra/missing one); None when equal."""
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e != a:
            return i
    if len(expected) != len(actual):
        return min(len(expected), len(actual))
    return None


def _window(index: int, length: int) -> range:
    return range(max(0, index - CONTEXT), min(length, index + CONTEXT + 1))


def side_by_side(title: str, expected: Sequence[Any], actual: Sequence[Any],
                 show: Callable[[Any], str] = str, label: Callable[[int], str] = lambda i: f"#{i}") -> str | None:
    """A readable report of the first difference between two lists, or None when they are equal."""
    index = first_difference(expected, actual)
    if index is None:
        return None
    counts = "" if len(expected) == len(actual) else f" (expected {len(expected)} entries, got {len(actual)})"
    lines = [f"{title}: first difference at {label(index)}{counts}"]
    for i in _window(index, max(len(expected), len(actual))):
        mark = ">" if i == index else " "
        exp = show(expected[i]) if i < len(expected) else "(nothing)"
        act = show(actual[i]) if i < len(actual) else "(nothing)"
        if exp == act:
            lines.append(f"{mark} {label(i)}: {exp}")
        else:
            lines.append(f"{mark} {label(i)}: expected {exp}")
            lines.append(f"{mark} {' ' * len(label(i))}       got {act}")
    return "\n".join(lines)


def assert_same_list(title: str, expected: Sequence[Any], actual: Sequence[Any], **kwargs: Any) -> None:
    report = side_by_side(title, list(expected), list(actual), **kwargs)
    if report is not None:
        pytest.fail(report, pytrace=False)


# -- lab 1: lifecycle events -------------------------------------------------------------

def show_event(event: dict[str, Any]) -> str:
    """One event on one line: step, name, request, then its own fields (time left out)."""
    fields = {k: v for k, v in event.items() if k not in ("event", "seq_id", "step", "time")}
    seq = "-" if event.get("seq_id") is None else event.get("seq_id")
    body = " ".join(f"{k}={v}" for k, v in fields.items())
    return f"step {event.get('step')} seq {seq} {event.get('event')} {body}".rstrip()


def assert_same_events(expected: list[dict[str, Any]], actual: list[dict[str, Any]], what: str) -> None:
    """Compare event lists (times dropped) and report the first differing event with its neighbours."""
    def strip(event: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in event.items() if k != "time"}
    assert_same_list(f"lifecycle log, {what}", [strip(e) for e in expected], [strip(e) for e in actual],
                     show=show_event, label=lambda i: f"event {i}")


# -- lab 2: block tables -------------------------------------------------------------------

def assert_block_tables(expected: dict[str, list[int]], actual: dict[str, list[int]], what: str) -> None:
    """Compare named block tables; print every table, marking the rows and first wrong block."""
    bad = [name for name in expected if expected[name] != actual.get(name)]
    if not bad:
        return
    lines = [f"block tables {what}: {len(bad)} of {len(expected)} differ"]
    for name, table in expected.items():
        got = actual.get(name)
        if table == got:
            lines.append(f"  {name}: {table}")
            continue
        index = first_difference(table, got or [])
        lines.append(f"> {name}: expected {table}")
        lines.append(f"> {' ' * len(name)}       got {got}   (first wrong: logical block {index})")
    pytest.fail("\n".join(lines), pytrace=False)


# -- lab 4: model inputs ---------------------------------------------------------------------

def assert_token_aligned(name: str, expected: list[int], actual: list[int],
                         owners: list[tuple[str, int]], explain: Callable[[int], str] | None = None) -> None:
    """Compare a per-token list (positions, slot_mapping...) and name the sequence and position that went wrong.

    `owners[i]` is (sequence name, token position) of flat entry i.
    """
    index = first_difference(expected, actual)
    if index is None:
        return
    counts = "" if len(expected) == len(actual) else f" (expected {len(expected)} entries, got {len(actual)})"
    lines = [f"{name}: first wrong entry at flat index {index}{counts}"]
    for i in _window(index, max(len(expected), len(actual))):
        who = f"{owners[i][0]} position {owners[i][1]}" if i < len(owners) else "(no such token)"
        exp = expected[i] if i < len(expected) else "(nothing)"
        act = actual[i] if i < len(actual) else "(nothing)"
        mark = ">" if i == index else " "
        note = f"   [{explain(exp)}]" if explain and i < len(expected) and exp != act else ""
        lines.append(f"{mark} [{i}] {who}: expected {exp}, got {act}{note}")
    pytest.fail("\n".join(lines), pytrace=False)


def assert_close(name: str, expected: Any, actual: Any, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Tensor comparison that reports the worst element and where it is, not just 'not close'."""
    import torch
    expected, actual = torch.as_tensor(expected).float(), torch.as_tensor(actual).float()
    if expected.shape != actual.shape:
        pytest.fail(f"{name}: expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}", pytrace=False)
    error = (expected - actual).abs()
    allowed = atol + rtol * expected.abs()
    if bool((error <= allowed).all()) and not bool(actual.isnan().any()):
        return
    worst = int((error - allowed).flatten().argmax())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), expected.shape))
    pytest.fail(f"{name}: {int((error > allowed).sum())} of {expected.numel()} values are off; worst at index "
                f"{where}: expected {expected[where].item():.6g}, got {actual[where].item():.6g}", pytrace=False)
