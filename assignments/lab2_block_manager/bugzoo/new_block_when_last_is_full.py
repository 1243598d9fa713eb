"""may_append adds a block when the length is a multiple of the block size (one token too early)."""
EDITS = {
    "lab2.may_append": [
        ("if len(seq.block_table) < seq.num_blocks:", "if len(seq) % self.block_size == 0:"),
    ],
}
