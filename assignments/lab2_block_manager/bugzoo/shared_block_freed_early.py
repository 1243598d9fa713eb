"""deallocate sets ref_count to 0 instead of decrementing it, freeing blocks other sequences still share."""
EDITS = {
    "lab2.deallocate": [
        ("block.ref_count -= 1", "block.ref_count = 0"),
    ],
}
