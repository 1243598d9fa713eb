"""Decoded sequences are put back at the front of running in reverse order, so the batch order flips each step."""
EDITS = {
    "lab3.schedule_decode": [
        ("self.running.extendleft(reversed(scheduled))", "self.running.extendleft(scheduled)"),
    ],
}
