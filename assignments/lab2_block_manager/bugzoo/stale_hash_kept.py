"""A reused block keeps its old hash_to_block entry, so a later prompt can hit overwritten K/V."""
EDITS = {
    "lab2.take_free_block": [
        ("del self.hash_to_block[block.hash]", "pass"),
    ],
}
