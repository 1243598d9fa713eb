"""A prefix hit trusts the hash alone: two blocks with equal hashes but different tokens share K/V."""
EDITS = {
    "lab2.prefix_hits": [
        ("if block_id is None or self.blocks[block_id].token_ids != tokens:", "if block_id is None:"),
    ],
}
