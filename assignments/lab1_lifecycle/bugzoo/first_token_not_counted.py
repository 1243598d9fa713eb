"""Output tokens are counted from TOKEN events only, forgetting the FIRST_TOKEN event."""
EDITS = {
    "lab1.request_metrics": [
        ('token_times = [e["time"] for e in events if e["event"] in TOKEN_EVENTS]',
         'token_times = [e["time"] for e in events if e["event"] == "TOKEN"]'),
    ],
}
