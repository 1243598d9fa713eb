"""TPOT divides the decode time by all output tokens instead of by output tokens - 1."""
EDITS = {
    "lab1.request_metrics": [
        ("decode_time / (num_tokens - 1)", "decode_time / num_tokens"),
    ],
}
