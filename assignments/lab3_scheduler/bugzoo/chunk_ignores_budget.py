"""(stretch) A continued prefill chunk takes the whole rest of the prompt, ignoring the budget left."""
EDITS = {
    "lab3.chunked_prefill": [
        ("min(seq.num_uncomputed_tokens, budget)", "seq.num_uncomputed_tokens"),
    ],
}
