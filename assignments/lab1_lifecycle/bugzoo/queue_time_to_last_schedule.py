"""Queue time ends at the last SCHEDULED event (after a preemption, or a decode step) instead of the first."""
EDITS = {
    "lab1.request_metrics": [
        ('queue_time=_elapsed(arrived, _first(events, "SCHEDULED"))',
         'queue_time=_elapsed(arrived, next((e for e in reversed(events) if e["event"] == "SCHEDULED"), None))'),
    ],
}
