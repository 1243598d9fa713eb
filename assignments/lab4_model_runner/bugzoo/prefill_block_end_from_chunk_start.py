"""A chunk's block ends are counted from where the chunk starts, not from block boundaries."""
EDITS = {
    "lab4.prepare_prefill": [
        ("last = min(end, (first // self.block_size + 1) * self.block_size)   # where first's block ends",
         "last = min(end, first + self.block_size)"),
    ],
}
