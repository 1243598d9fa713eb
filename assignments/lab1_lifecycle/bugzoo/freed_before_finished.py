"""FREED is logged before FINISHED (blocks are returned, then the request is declared done)."""
EDITS = {
    "lab1.emit_finish": [
        ('        self.log.emit("FINISHED", seq.seq_id, now=now, reason=reason,\n'
         '                      num_output_tokens=seq.num_output_tokens)\n'
         '        self.log.emit("FREED", seq.seq_id, now=now, blocks_freed=blocks_freed)\n',
         '        self.log.emit("FREED", seq.seq_id, now=now, blocks_freed=blocks_freed)\n'
         '        self.log.emit("FINISHED", seq.seq_id, now=now, reason=reason,\n'
         '                      num_output_tokens=seq.num_output_tokens)\n'),
    ],
}
