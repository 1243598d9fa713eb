"""Right: every event and metric written from the handout's tables, in a style of its own (helpers, one pass)."""
RIGHT = True
BODIES = {
    "lab1.emit_arrival": '''
        self.log.emit("ARRIVED", seq.seq_id, now=seq.arrival_time, prompt_len=seq.num_prompt_tokens)
        self.scheduler.add(seq)
    ''',
    "lab1.emit_queued": '''
        self.log.emit("QUEUED", seq.seq_id, reason="new")
    ''',
    "lab1.emit_scheduled": '''
        stamp = self.log.now()
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = stamp
        self.log.emit("SCHEDULED", seq.seq_id, now=stamp, is_prefill=is_prefill, num_new_tokens=num_tokens,
                      num_cached_tokens=seq.num_cached_tokens, block_table=seq.block_table[:])
    ''',
    "lab1.emit_step": '''
        self.log.emit("STEP", None, is_prefill=is_prefill, batch_size=len(seqs),
                      num_tokens=_tokens_this_step(seqs), num_running=self.num_running,
                      num_waiting=self.num_waiting, kv_blocks_used=self.block_manager.num_used_blocks,
                      kv_blocks_total=self.model_runner.num_kvcache_blocks)
    ''',
    "lab1.emit_token": '''
        position = len(seq.output_token_ids) - 1
        if seq.first_token_time is None:
            seq.first_token_time = now
            self.log.emit("FIRST_TOKEN", seq.seq_id, now=now, index=position, token_id=token)
        else:
            self.log.emit("TOKEN", seq.seq_id, now=now, index=position, token_id=token)
    ''',
    "lab1.emit_preemption": '''
        self.log.emit("PREEMPTED", seq.seq_id, blocks_freed=blocks_freed)
        self.log.emit("QUEUED", seq.seq_id, reason="preempted")
    ''',
    "lab1.emit_finish": '''
        self.log.emit("FINISHED", seq.seq_id, now=now, reason=reason, num_output_tokens=len(seq.output_token_ids))
        self.log.emit("FREED", seq.seq_id, now=now, blocks_freed=blocks_freed)
    ''',
    "lab1.request_metrics": '''
        first: dict[str, float] = {}
        token_times: list[float] = []
        prompt_len = reason = None
        preemptions = 0
        for e in events:
            first.setdefault(e["event"], e["time"])
            if e["event"] in ("FIRST_TOKEN", "TOKEN"):
                token_times.append(e["time"])
            elif e["event"] == "ARRIVED" and prompt_len is None:
                prompt_len = e.get("prompt_len")
            elif e["event"] == "FINISHED" and reason is None:
                reason = e.get("reason")
            elif e["event"] == "PREEMPTED":
                preemptions += 1

        def span(start, end):
            return first[end] - first[start] if start in first and end in first else None

        tpot = None
        if len(token_times) > 1 and "FINISHED" in first and "FIRST_TOKEN" in first:
            tpot = (first["FINISHED"] - first["FIRST_TOKEN"]) / (len(token_times) - 1)
        return RequestMetrics(seq_id=seq_id, prompt_len=prompt_len, num_output_tokens=len(token_times),
                              queue_time=span("ARRIVED", "SCHEDULED"), ttft=span("ARRIVED", "FIRST_TOKEN"),
                              tpot=tpot, itls=[b - a for a, b in zip(token_times, token_times[1:])],
                              e2e=span("ARRIVED", "FINISHED"), num_preemptions=preemptions, finish_reason=reason)
    ''',
}
ADDED = {
    "engine/llm_engine.py": '''
        def _tokens_this_step(seqs):
            """The K/V a step computes: every scheduled token of every sequence in the batch."""
            return sum(seq.num_scheduled_tokens for seq in seqs)
    ''',
}
