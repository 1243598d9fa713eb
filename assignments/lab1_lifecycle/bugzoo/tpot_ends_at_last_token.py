"""TPOT ends at the last token instead of FINISHED: the same for every request but one aborted mid-decode."""
EDITS = {
    "lab1.request_metrics": [
        ("decode_time = _elapsed(first_token, finished)",
         "decode_time = None if finished is None else token_times[-1] - first_token[\"time\"]"),
    ],
}
