"""Right: the five rules of the handout (chunked prefill too), with the checks in a different order and helpers."""
RIGHT = True
BODIES = {
    "lab3.admit": '''
        while self.waiting:
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            head = self.waiting[0]
            cost = len(head) - self.block_manager.num_cached_tokens(head)
            if cost > budget and not self.chunked_prefill:
                break                      # first come, first served: nobody behind the head goes first
            if not self.block_manager.can_allocate(head):
                break
            self.block_manager.allocate(head)
            self.waiting.popleft()
            head.status = SequenceStatus.RUNNING
            self.running.append(head)
            chunk = min(head.num_uncomputed_tokens, budget)
            self._schedule(head, chunk, True, scheduled)
            budget -= chunk
    ''',
    "lab3.chunked_prefill": '''
        for seq in list(self.running):
            if budget <= 0:
                break
            if not seq.in_prefill:
                continue
            chunk = min(seq.num_uncomputed_tokens, budget)
            self._schedule(seq, chunk, True, scheduled)
            budget -= chunk
        return budget
    ''',
    "lab3.schedule_decode": '''
        batch: list[Sequence] = []
        cap = min(self.max_num_seqs, self.max_num_batched_tokens)
        while self.running and len(batch) < cap:
            seq = self.running.popleft()
            if _make_room(self, seq):
                self.block_manager.may_append(seq)
                self._schedule(seq, 1, False, batch)
        for seq in reversed(batch):
            self.running.appendleft(seq)
        return batch
    ''',
    "lab3.preempt": '''
        blocks_freed = self.block_manager.deallocate(seq)
        seq.num_preemptions = seq.num_preemptions + 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
    ''',
}
ADDED = {
    "engine/scheduler.py": '''
        def _make_room(scheduler, seq):
            """Preempt the newest running request until seq's next token has a slot; False if seq gave way itself."""
            while not scheduler.block_manager.can_append(seq):
                if not scheduler.running:
                    scheduler.preempt(seq)
                    return False
                scheduler.preempt(scheduler.running.pop())
            return True
    ''',
}
