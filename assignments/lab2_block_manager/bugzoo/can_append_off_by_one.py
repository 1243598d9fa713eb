"""can_append asks for a free block even when the newest token still fits in the last block."""
EDITS = {
    "lab2.can_append": [
        ("len(seq.block_table) >= seq.num_blocks", "len(seq.block_table) > seq.num_blocks"),
    ],
}
