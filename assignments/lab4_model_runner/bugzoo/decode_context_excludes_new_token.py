"""A decode step's context length leaves out the token being decoded, so it never attends to itself."""
EDITS = {
    "lab4.prepare_decode": [
        ("context_lens = [len(seq) for seq in seqs]", "context_lens = [len(seq) - 1 for seq in seqs]"),
    ],
}
