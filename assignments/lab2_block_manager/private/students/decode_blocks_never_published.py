"""Publishes only the blocks a prefill fills: a block that decode tokens fill is never hashed (rule 3 missed)."""
BODIES = {
    "lab2.prefix_hits": '''
        if not self.enable_prefix_caching:
            return []
        hits, prev = [], None
        for i in range((len(seq) - 1) // self.block_size):
            h = chain_hash(seq.block(i), prev)
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != seq.block(i):
                break
            hits.append(block_id)
            prev = h
        return hits
    ''',
    "lab2.can_allocate": '''
        hits = self._prefix_hits(seq)
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return seq.num_blocks - len(hits) + revived <= self.num_free_blocks
    ''',
    "lab2.allocate": '''
        hits = self._prefix_hits(seq)
        for b in hits:
            if self.blocks[b].ref_count == 0:
                del self.free_block_ids[b]
            self.blocks[b].ref_count += 1
        seq.block_table = hits + [self._take_free_block() for _ in range(seq.num_blocks - len(hits))]
        seq.num_cached_tokens = len(hits) * self.block_size
    ''',
    "lab2.take_free_block": '''
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]
        block.reset()
        return block_id
    ''',
    "lab2.deallocate": '''
        freed = 0
        for b in reversed(seq.block_table):
            self.blocks[b].ref_count -= 1
            if self.blocks[b].ref_count == 0:
                self.free_block_ids[b] = None
                freed += 1
        seq.block_table = []
        seq.num_cached_tokens = 0
        return freed
    ''',
    "lab2.can_append": '''
        return len(seq.block_table) >= seq.num_blocks or self.num_free_blocks >= 1
    ''',
    "lab2.may_append": '''
        if len(seq.block_table) < seq.num_blocks:
            seq.block_table.append(self._take_free_block())
    ''',
    "lab2.mark_computed": '''
        start = seq.num_cached_tokens
        seq.num_cached_tokens += num_new_tokens
        if not self.enable_prefix_caching or num_new_tokens == 1:
            return      # a decode step: nothing to publish, or so this student thinks
        for i in range(start // self.block_size, seq.num_cached_tokens // self.block_size):
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                continue
            prev = self.blocks[seq.block_table[i - 1]].hash if i > 0 else None
            block.token_ids = seq.block(i)
            block.hash = chain_hash(block.token_ids, prev)
            self.hash_to_block[block.hash] = block.block_id
    ''',
}
