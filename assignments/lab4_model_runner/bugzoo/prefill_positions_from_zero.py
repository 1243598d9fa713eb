"""Prefill positions always start at 0, ignoring the cached prefix or the earlier chunks."""
EDITS = {
    "lab4.prepare_prefill": [
        ("positions += range(start, end)", "positions += range(0, end - start)"),
    ],
}
