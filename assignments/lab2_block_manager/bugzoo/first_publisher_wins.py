"""When two blocks publish the same hash, the first one keeps the cache entry instead of the latest."""
EDITS = {
    "lab2.mark_computed": [
        ("self.hash_to_block[block.hash] = block.block_id", "self.hash_to_block.setdefault(block.hash, block.block_id)"),
    ],
}
