"""may_append adds a block when len(seq) % block_size == 1, which never holds at block size 1."""
EDITS = {
    "lab2.may_append": [
        ("if len(seq.block_table) < seq.num_blocks:", "if len(seq) % self.block_size == 1:"),
    ],
}
