"""A one-token request gets TPOT 0.0 instead of no TPOT at all (None)."""
EDITS = {
    "lab1.request_metrics": [
        ("tpot = None\n", "tpot = 0.0\n"),
    ],
}
