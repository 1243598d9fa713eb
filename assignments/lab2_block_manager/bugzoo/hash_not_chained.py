"""Block hashes cover only the block's own tokens, not the prefix before it (no hash chain)."""
EDITS = {
    "lab2.prefix_hits": [
        ("h = chain_hash(tokens, prev_hash)", "h = chain_hash(tokens, None)"),
    ],
    "lab2.mark_computed": [
        ("block.hash = chain_hash(block.token_ids, prev_hash)", "block.hash = chain_hash(block.token_ids, None)"),
    ],
}
