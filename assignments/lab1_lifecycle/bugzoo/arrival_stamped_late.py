"""ARRIVED takes a fresh clock reading instead of the arrival time the Sequence recorded."""
EDITS = {
    "lab1.emit_arrival": [
        ('self.log.emit("ARRIVED", seq.seq_id, self.step_index, now, prompt_len=len(token_ids))',
         'self.log.emit("ARRIVED", seq.seq_id, self.step_index, prompt_len=len(token_ids))'),
    ],
}
