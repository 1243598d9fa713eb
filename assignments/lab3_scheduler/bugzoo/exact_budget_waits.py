"""A prompt that exactly fills the token budget is made to wait (> turned into >=)."""
EDITS = {
    "lab3.admit": [
        ("if num_new > budget and not self.chunked_prefill:", "if num_new >= budget and not self.chunked_prefill:"),
    ],
}
