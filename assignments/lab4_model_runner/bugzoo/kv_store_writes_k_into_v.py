"""(GPU) The KV-store kernel writes every token's K row into the V cache too (V pointer typo)."""
GPU = True
EDITS = {
    "lab4.kv_store_kernel": [
        ("tl.store(v_cache_ptr + slot.to(tl.int64) * ROW + offs, v, mask=mask)",
         "tl.store(v_cache_ptr + slot.to(tl.int64) * ROW + offs, k, mask=mask)"),
    ],
}
