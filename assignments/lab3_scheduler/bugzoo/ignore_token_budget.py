"""Admission never compares a prompt with the token budget left (only the KV blocks are checked)."""
EDITS = {
    "lab3.admit": [
        ("if num_new > budget and not self.chunked_prefill:", "if False:"),
    ],
}
