"""deallocate never lowers ref_count, so no block ever returns to the free list."""
EDITS = {
    "lab2.deallocate": [
        ("            block.ref_count -= 1\n", ""),
    ],
}
