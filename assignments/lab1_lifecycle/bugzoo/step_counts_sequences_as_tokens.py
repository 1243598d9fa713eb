"""STEP's num_tokens counts the sequences in the batch instead of the tokens computed."""
EDITS = {
    "lab1.emit_step": [
        ("num_tokens=sum(s.num_scheduled_tokens for s in seqs)", "num_tokens=len(seqs)"),
    ],
}
