"""Blocks are freed first to last, so a sequence's prefix blocks are the first to be reused."""
EDITS = {
    "lab2.deallocate": [
        ("for block_id in reversed(seq.block_table):", "for block_id in seq.block_table:"),
    ],
}
