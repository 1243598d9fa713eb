"""TTFT is measured from the first SCHEDULED event instead of from ARRIVED."""
EDITS = {
    "lab1.request_metrics": [
        ("ttft=_elapsed(arrived, first_token)", 'ttft=_elapsed(_first(events, "SCHEDULED"), first_token)'),
    ],
}
