"""Admission ignores max_num_seqs: every waiting request that fits the token budget gets a seat."""
EDITS = {
    "lab3.admit": [
        ("while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:",
         "while self.waiting and budget > 0:"),
    ],
}
