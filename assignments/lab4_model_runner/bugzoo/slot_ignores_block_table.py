"""The slot uses the logical block number as if it were the physical block (blocks assumed contiguous)."""
EDITS = {
    "lab4.slot": [
        ("seq.block_table[position // self.block_size] * self.block_size", "(position // self.block_size) * self.block_size"),
    ],
}
