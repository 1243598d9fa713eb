"""The decode position is len(seq) instead of len(seq) - 1 (the newest token's own index)."""
EDITS = {
    "lab4.prepare_decode": [
        ("positions = [len(seq) - 1 for seq in seqs]", "positions = [len(seq) for seq in seqs]"),
    ],
}
