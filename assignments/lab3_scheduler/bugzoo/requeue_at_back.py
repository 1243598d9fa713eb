"""A preempted request goes to the back of the waiting queue instead of the front."""
EDITS = {
    "lab3.preempt": [
        ("self.waiting.appendleft(seq)", "self.waiting.append(seq)"),
    ],
}
