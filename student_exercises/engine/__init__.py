# Generated from reference/engine/__init__.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""The engine's moving parts: sequences, block manager, scheduler, model runner, engine loop."""
