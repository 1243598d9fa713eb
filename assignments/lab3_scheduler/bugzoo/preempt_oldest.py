"""When blocks run out, decode preempts the oldest running request instead of the newest."""
EDITS = {
    "lab3.schedule_decode": [
        ("self.preempt(self.running.pop())", "self.preempt(self.running.popleft())"),
    ],
}
