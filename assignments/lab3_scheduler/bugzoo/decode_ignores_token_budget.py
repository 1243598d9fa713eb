"""A decode batch is capped by max_num_seqs only, not by max_num_batched_tokens."""
EDITS = {
    "lab3.schedule_decode": [
        ("limit = min(self.max_num_seqs, self.max_num_batched_tokens)", "limit = self.max_num_seqs"),
    ],
}
