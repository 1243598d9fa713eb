"""A decode token is scheduled (and its SCHEDULED event logged) before its block is appended."""
EDITS = {
    "lab3.schedule_decode": [
        ("                self.block_manager.may_append(seq)\n                self._schedule(seq, 1, False, scheduled)",
         "                self._schedule(seq, 1, False, scheduled)\n                self.block_manager.may_append(seq)"),
    ],
}
