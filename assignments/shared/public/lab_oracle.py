"""The independent oracle of the engine-level public tests: transformers' own greedy decoding.

One prompt at a time, no paging, no batching, no prefix cache: nothing of the
engine under test, so agreeing with it means the engine computed the right
thing, not merely the same thing twice. It is the course's one oracle
(`courseware/oracle.py`), the same the course's own tests compare against;
`hf_greedy(model_dir, prompt, n)` never stops early (the engine's `ignore_eos`).
"""
from __future__ import annotations

from courseware.oracle import hf_greedy, hf_model

__all__ = ["hf_greedy", "hf_model"]
