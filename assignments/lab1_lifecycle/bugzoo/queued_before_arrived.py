"""The request is handed to the scheduler (QUEUED) before its ARRIVED event is logged."""
EDITS = {
    "lab1.emit_arrival": [
        ('        self.log.emit("ARRIVED", seq.seq_id, now=now, prompt_len=len(token_ids))\n'
         '        self.scheduler.add(seq)\n',
         '        self.scheduler.add(seq)\n'
         '        self.log.emit("ARRIVED", seq.seq_id, now=now, prompt_len=len(token_ids))\n'),
    ],
}
