"""A preempted sequence keeps status RUNNING while it waits to be recomputed."""
EDITS = {
    "lab3.preempt": [
        ("seq.status = SequenceStatus.WAITING", "pass"),
    ],
}
