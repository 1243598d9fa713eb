"""can_allocate forgets that reviving a cached block from the free list uses up a free block."""
EDITS = {
    "lab2.can_allocate": [
        ("(seq.num_blocks - len(hits)) + revived <= self.num_free_blocks",
         "seq.num_blocks - len(hits) <= self.num_free_blocks"),
    ],
}
