"""The inter-token latencies start at ARRIVED, so the first gap is really the TTFT."""
EDITS = {
    "lab1.request_metrics": [
        ("zip(token_times, token_times[1:])", 'zip([arrived["time"]] + token_times, token_times)'),
    ],
}
