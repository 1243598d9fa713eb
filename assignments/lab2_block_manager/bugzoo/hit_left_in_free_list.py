"""A prefix hit on a freed block revives it without taking it out of the free list."""
EDITS = {
    "lab2.allocate": [
        ("del self.free_block_ids[block_id]", "pass"),
    ],
}
