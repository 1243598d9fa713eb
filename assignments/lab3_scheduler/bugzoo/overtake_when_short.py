"""Admission skips a request that does not fit and admits later ones (no first come, first served)."""
EDITS = {
    "lab3.admit": [
        ("while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:\n"
         "            seq = self.waiting[0]\n",
         "for seq in list(self.waiting):\n"
         "            if len(self.running) >= self.max_num_seqs or budget <= 0:\n"
         "                break\n"),
        ("break  # first come, first served: later requests wait too", "continue"),
        ("if not self.block_manager.can_allocate(seq):\n                break",
         "if not self.block_manager.can_allocate(seq):\n                continue"),
        ("self.waiting.popleft()", "self.waiting.remove(seq)"),
    ],
}
