"""The KV-store kernel writes each K row into the V cache too (a V pointer typo; CPU interpreter and GPU)."""
GRADED_ON_GPU = True     # the CPU public tests catch it; the grader grades this region only on a GPU
EDITS = {
    "lab4.kv_store_kernel": [
        ("tl.store(v_cache_ptr + slot.to(tl.int64) * ROW + offs, v, mask=mask)",
         "tl.store(v_cache_ptr + slot.to(tl.int64) * ROW + offs, k, mask=mask)"),
    ],
}
