"""deallocate leaves num_cached_tokens as it was, so a preempted sequence claims K/V it no longer has."""
EDITS = {
    "lab2.deallocate": [
        ("        seq.num_cached_tokens = 0\n", ""),
    ],
}
