"""End-to-end latency is measured from the first SCHEDULED event instead of from ARRIVED."""
EDITS = {
    "lab1.request_metrics": [
        ("e2e=_elapsed(arrived, finished)", 'e2e=_elapsed(_first(events, "SCHEDULED"), finished)'),
    ],
}
