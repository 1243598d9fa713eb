"""The decode slot is taken as last block * block_size + len % block_size: one slot past the newest token."""
EDITS = {
    "lab4.prepare_decode": [
        ("slot_mapping = [self._slot(seq, len(seq) - 1) for seq in seqs]",
         "slot_mapping = [seq.block_table[-1] * self.block_size + len(seq) % self.block_size for seq in seqs]"),
    ],
}
