"""prompt_len is taken from the first SCHEDULED's num_new_tokens: right until a prefix hit shortens that prefill."""
EDITS = {
    "lab1.request_metrics": [
        ('prompt_len=arrived.get("prompt_len") if arrived else None,',
         'prompt_len=(_first(events, "SCHEDULED") or {}).get("num_new_tokens"),'),
    ],
}
