"""The head of the waiting queue is marked RUNNING before the KV blocks are checked: refused, it waits as RUNNING."""
EDITS = {
    "lab3.admit": [
        ("            if not self.block_manager.can_allocate(seq):\n",
         "            seq.status = SequenceStatus.RUNNING\n            if not self.block_manager.can_allocate(seq):\n"),
    ],
}
