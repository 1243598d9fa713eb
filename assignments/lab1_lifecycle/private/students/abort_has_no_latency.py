"""Reads "被 abort 让对应指标为 None" as: an aborted request has no end-to-end latency and no TPOT at all."""
BODIES = {
    "lab1.emit_arrival": '''
        self.log.emit("ARRIVED", seq.seq_id, now=now, prompt_len=len(token_ids))
        self.scheduler.add(seq)
    ''',
    "lab1.emit_queued": '''
        self.log.emit("QUEUED", seq.seq_id, reason="new")
    ''',
    "lab1.emit_scheduled": '''
        now = self.log.now()
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = now
        self.log.emit("SCHEDULED", seq.seq_id, now=now, is_prefill=is_prefill, num_new_tokens=num_tokens,
                      num_cached_tokens=seq.num_cached_tokens, block_table=list(seq.block_table))
    ''',
    "lab1.emit_step": '''
        self.log.emit("STEP", None, is_prefill=is_prefill, batch_size=len(seqs),
                      num_tokens=sum(s.num_scheduled_tokens for s in seqs),
                      num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
                      kv_blocks_used=self.block_manager.num_used_blocks, kv_blocks_total=len(self.block_manager.blocks))
    ''',
    "lab1.emit_token": '''
        if seq.num_output_tokens == 1:
            seq.first_token_time = now
            self.log.emit("FIRST_TOKEN", seq.seq_id, now=now, index=0, token_id=token)
        else:
            self.log.emit("TOKEN", seq.seq_id, now=now, index=seq.num_output_tokens - 1, token_id=token)
    ''',
    "lab1.emit_preemption": '''
        self.log.emit("PREEMPTED", seq.seq_id, blocks_freed=blocks_freed)
        self.log.emit("QUEUED", seq.seq_id, reason="preempted")
    ''',
    "lab1.emit_finish": '''
        self.log.emit("FINISHED", seq.seq_id, now=now, reason=reason, num_output_tokens=seq.num_output_tokens)
        self.log.emit("FREED", seq.seq_id, now=now, blocks_freed=blocks_freed)
    ''',
    "lab1.request_metrics": '''
        arrived = _first(events, "ARRIVED")
        first_token = _first(events, "FIRST_TOKEN")
        finished = _first(events, "FINISHED")
        aborted = finished is not None and finished.get("reason") == "abort"
        token_times = [e["time"] for e in events if e["event"] in TOKEN_EVENTS]
        tpot = None
        if len(token_times) >= 2 and finished is not None and not aborted:
            tpot = (finished["time"] - first_token["time"]) / (len(token_times) - 1)
        return RequestMetrics(
            seq_id=seq_id, prompt_len=arrived.get("prompt_len") if arrived else None,
            num_output_tokens=len(token_times), queue_time=_elapsed(arrived, _first(events, "SCHEDULED")),
            ttft=_elapsed(arrived, first_token), tpot=tpot,
            itls=[b - a for a, b in zip(token_times, token_times[1:])],
            e2e=None if aborted else _elapsed(arrived, finished),
            num_preemptions=sum(1 for e in events if e["event"] == "PREEMPTED"),
            finish_reason=finished.get("reason") if finished else None)
    ''',
}
