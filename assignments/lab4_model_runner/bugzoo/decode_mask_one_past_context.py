"""The decode mask lets each query see one slot past its context (an unwritten or stale key)."""
EDITS = {
    "lab4.paged_decode": [
        ("positions[None, :] < meta.context_lens[:, None]", "positions[None, :] <= meta.context_lens[:, None]"),
    ],
}
