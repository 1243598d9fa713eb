"""(stretch) Admission goes on after the budget is spent, scheduling 0-token first chunks (budget >= 0)."""
EDITS = {
    "lab3.admit": [
        ("len(self.running) < self.max_num_seqs and budget > 0:", "len(self.running) < self.max_num_seqs and budget >= 0:"),
    ],
}
