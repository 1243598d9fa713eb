"""Reusing a block deletes its hash's cache entry even when that entry now points at another block."""
EDITS = {
    "lab2.take_free_block": [
        ("if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:",
         "if block.hash is not None and block.hash in self.hash_to_block:"),
    ],
}
