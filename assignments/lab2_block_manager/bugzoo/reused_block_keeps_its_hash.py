"""A reused block only gets ref_count 1 (no reset), keeps its old hash and is never published with its new content."""
EDITS = {
    "lab2.take_free_block": [
        ("block.reset()", "block.ref_count = 1"),
    ],
}
