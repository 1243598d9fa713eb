"""Preemption sets num_preemptions to 1 instead of adding one, so a second preemption is not counted."""
EDITS = {
    "lab3.preempt": [
        ("seq.num_preemptions += 1", "seq.num_preemptions = 1"),
    ],
}
