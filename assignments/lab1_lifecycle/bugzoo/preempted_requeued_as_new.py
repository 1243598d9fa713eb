"""The QUEUED event after a preemption gives reason "new" instead of "preempted"."""
EDITS = {
    "lab1.emit_preemption": [
        ('reason="preempted"', 'reason="new"'),
    ],
}
