# Generated from reference/standins/labs.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""The labs whose parts this package replaces with stand-ins: none in the course repository.

`inferlab release --lab labN` rewrites this module in the release it writes,
naming the labs after N, whose regions it stubs (see reference/standins/__init__.py).
"""
from __future__ import annotations

STANDIN_LABS: frozenset[str] = frozenset()
