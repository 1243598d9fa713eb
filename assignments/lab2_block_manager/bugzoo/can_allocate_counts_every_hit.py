"""can_allocate demands a free block for every cache hit, even hits other sequences still hold."""
EDITS = {
    "lab2.can_allocate": [
        ("(seq.num_blocks - len(hits)) + revived <= self.num_free_blocks",
         "seq.num_blocks <= self.num_free_blocks"),
    ],
}
