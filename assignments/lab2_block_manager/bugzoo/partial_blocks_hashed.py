"""mark_computed hashes a block before it is full, so it never gets the hash of its full content."""
EDITS = {
    "lab2.mark_computed": [
        ("last_full = seq.num_cached_tokens // self.block_size",
         "last_full = -(-seq.num_cached_tokens // self.block_size)"),
    ],
}
