"""ARRIVED takes a fresh clock reading instead of the arrival time the Sequence recorded."""
EDITS = {
    "lab1.emit_arrival": [
        ('self.log.emit("ARRIVED", seq.seq_id, now=now, prompt_len=len(token_ids))',
         'self.log.emit("ARRIVED", seq.seq_id, prompt_len=len(token_ids))'),
    ],
}
