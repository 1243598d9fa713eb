"""Helpers of the project's own tests that nothing else needs (the oracle is courseware/oracle.py)."""
from __future__ import annotations


def events_of(events: list[dict], name: str, seq_id: int | None = None) -> list[dict]:
    return [e for e in events if e["event"] == name and (seq_id is None or e["seq_id"] == seq_id)]
