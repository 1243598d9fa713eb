"""A prefill's context length (seqlen_k) counts only this step's new tokens, not the cached prefix."""
EDITS = {
    "lab4.prepare_prefill": [
        ("context_lens.append(end)", "context_lens.append(end - start)"),
    ],
}
