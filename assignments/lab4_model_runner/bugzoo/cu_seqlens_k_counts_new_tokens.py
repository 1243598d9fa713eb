"""cu_seqlens_k sums the new tokens (like cu_seqlens_q) instead of the context lengths."""
EDITS = {
    "lab4.prepare_prefill": [
        ("cu_seqlens_k.append(cu_seqlens_k[-1] + end)", "cu_seqlens_k.append(cu_seqlens_k[-1] + end - start)"),
    ],
}
