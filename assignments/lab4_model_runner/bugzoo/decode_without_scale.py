"""Decode attention forgets the 1/sqrt(head_dim) softmax scale."""
EDITS = {
    "lab4.paged_decode": [
        ("v.transpose(1, 2), mask, scale)", "v.transpose(1, 2), mask, 1.0)"),
    ],
}
