"""A sequence that had to preempt itself is still given a block and scheduled for decode."""
EDITS = {
    "lab3.schedule_decode": [
        ("            else:\n"
         "                self.block_manager.may_append(seq)\n"
         "                self._schedule(seq, 1, False, scheduled)\n",
         "            self.block_manager.may_append(seq)\n"
         "            self._schedule(seq, 1, False, scheduled)\n"),
    ],
}
