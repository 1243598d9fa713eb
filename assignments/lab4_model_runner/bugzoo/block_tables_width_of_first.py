"""The block-table tensor is as wide as the first sequence's table, cutting longer tables short."""
EDITS = {
    "lab4.block_tables": [
        ("width = max(len(seq.block_table) for seq in seqs)", "width = len(seqs[0].block_table)"),
        ("row[:len(seq.block_table)] = seq.block_table", "row[:] = (seq.block_table + [0] * width)[:width]"),
    ],
}
