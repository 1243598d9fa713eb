"""Queue time starts at QUEUED instead of ARRIVED (the time between arriving and being queued is lost)."""
EDITS = {
    "lab1.request_metrics": [
        ('queue_time=_elapsed(arrived, _first(events, "SCHEDULED"))',
         'queue_time=_elapsed(_first(events, "QUEUED"), _first(events, "SCHEDULED"))'),
    ],
}
