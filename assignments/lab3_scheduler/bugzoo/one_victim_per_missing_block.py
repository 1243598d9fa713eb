"""Decode preempts one victim when a block is missing and then appends, even if the victim freed no block."""
EDITS = {
    "lab3.schedule_decode": [
        ("            while not self.block_manager.can_append(seq):\n"
         "                if self.running:\n"
         "                    self.preempt(self.running.pop())  # the newest request gives way\n"
         "                else:\n"
         "                    self.preempt(seq)                 # nobody left to evict: itself\n"
         "                    break\n"
         "            else:\n"
         "                self.block_manager.may_append(seq)\n"
         "                self._schedule(seq, 1, False, scheduled)\n",
         "            if not self.block_manager.can_append(seq):\n"
         "                if self.running:\n"
         "                    self.preempt(self.running.pop())  # the newest request gives way\n"
         "                else:\n"
         "                    self.preempt(seq)                 # nobody left to evict: itself\n"
         "                    continue\n"
         "            self.block_manager.may_append(seq)\n"
         "            self._schedule(seq, 1, False, scheduled)\n"),
    ],
}
