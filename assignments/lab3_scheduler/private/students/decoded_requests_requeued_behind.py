"""Puts the sequences a decode step scheduled back at the *end* of running, behind the ones it did not reach."""
BODIES = {
    "lab3.admit": '''
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            num_new = len(seq) - self.block_manager.num_cached_tokens(seq)
            if num_new > budget and not self.chunked_prefill:
                break
            if not self.block_manager.can_allocate(seq):
                break
            self.block_manager.allocate(seq)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._schedule(seq, min(seq.num_uncomputed_tokens, budget), True, scheduled)
            budget -= seq.num_scheduled_tokens
    ''',
    "lab3.chunked_prefill": '''
        for seq in self.running:
            if budget == 0:
                break
            if seq.in_prefill:
                self._schedule(seq, min(seq.num_uncomputed_tokens, budget), True, scheduled)
                budget -= seq.num_scheduled_tokens
        return budget
    ''',
    "lab3.schedule_decode": '''
        scheduled: list[Sequence] = []
        limit = min(self.max_num_seqs, self.max_num_batched_tokens)
        while self.running and len(scheduled) < limit:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self.preempt(self.running.pop())
                else:
                    self.preempt(seq)
                    break
            else:
                self.block_manager.may_append(seq)
                self._schedule(seq, 1, False, scheduled)
        self.running.extend(scheduled)          # back into running, in their order
        return scheduled
    ''',
    "lab3.preempt": '''
        blocks_freed = self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
    ''',
}
