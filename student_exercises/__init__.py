# Generated from reference/__init__.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""InferLab reference engine: `from reference import LLM, SamplingParams`.

The four names load on first use (PEP 562's module `__getattr__`), so that
importing one light module of the package (`reference.metrics`, which the
grader and `inferlab trace` use on lifecycle logs) does not load the engine
and torch with it. `from reference import LLM` reads the same as ever.
"""
from __future__ import annotations

import importlib

__all__ = ["LLM", "SamplingParams", "Config", "StreamChunk"]
# name -> the module of this package that defines it (relative: the generated student package has the same)
_HOMES = {"LLM": "llm", "StreamChunk": "llm", "SamplingParams": "sampling_params", "Config": "config"}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'reference' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value          # the next lookup finds it directly
    return value
