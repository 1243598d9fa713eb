"""The engine's moving parts: sequences, block manager, scheduler, model runner, engine loop."""
