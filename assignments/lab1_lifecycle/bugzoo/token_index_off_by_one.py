"""The token index is read after the append without subtracting one: the first token is logged as TOKEN 1."""
EDITS = {
    "lab1.emit_token": [
        ("index = seq.num_output_tokens - 1", "index = seq.num_output_tokens"),
    ],
}
