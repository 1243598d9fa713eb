"""TPOT is left undefined for a request with exactly two output tokens (it needs only one gap)."""
EDITS = {
    "lab1.request_metrics": [
        ("if num_tokens >= 2:", "if num_tokens > 2:"),
    ],
}
