"""A prefix hit may cover the whole prompt, leaving no token to compute (and nothing to sample from)."""
EDITS = {
    "lab2.prefix_hits": [
        ("range((len(seq) - 1) // self.block_size)", "range(len(seq) // self.block_size)"),
    ],
}
