"""STEP's batch_size counts the running sequences instead of the sequences scheduled in this step."""
EDITS = {
    "lab1.emit_step": [
        ("batch_size=len(seqs)", "batch_size=len(self.scheduler.running)"),
    ],
}
