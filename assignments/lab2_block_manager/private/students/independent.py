"""Right: the six rules of the handout, written with helpers of its own (a hit walk, a release helper)."""
RIGHT = True
BODIES = {
    "lab2.prefix_hits": '''
        found = []
        if self.enable_prefix_caching:
            parent = None
            full_blocks = (len(seq) - 1) // self.block_size      # never the block of the last token
            for index in range(full_blocks):
                content = seq.block(index)
                key = chain_hash(content, parent)
                candidate = self.hash_to_block.get(key)
                if candidate is None or self.blocks[candidate].token_ids != content:
                    break
                found.append(candidate)
                parent = key
        return found
    ''',
    "lab2.can_allocate": '''
        hits = self._prefix_hits(seq)
        need = seq.num_blocks - len(hits)
        need += len([b for b in hits if self.blocks[b].ref_count == 0])    # revived hits leave the free list
        return need <= self.num_free_blocks
    ''',
    "lab2.allocate": '''
        table = []
        for block_id in self._prefix_hits(seq):
            _hold(self, block_id)
            table.append(block_id)
        cached = len(table) * self.block_size
        while len(table) < seq.num_blocks:
            table.append(self._take_free_block())
        seq.block_table = table
        seq.num_cached_tokens = cached
    ''',
    "lab2.take_free_block": '''
        block_id = next(iter(self.free_block_ids))
        del self.free_block_ids[block_id]
        block = self.blocks[block_id]
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            self.hash_to_block.pop(block.hash)
        block.reset()
        return block_id
    ''',
    "lab2.deallocate": '''
        released = 0
        while seq.block_table:
            block = self.blocks[seq.block_table.pop()]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block.block_id] = None
                released += 1
        seq.num_cached_tokens = 0
        return released
    ''',
    "lab2.can_append": '''
        needs_new_block = seq.num_blocks > len(seq.block_table)
        return not needs_new_block or self.num_free_blocks > 0
    ''',
    "lab2.may_append": '''
        if (len(seq) - 1) % self.block_size == 0 and len(seq.block_table) < seq.num_blocks:
            seq.block_table.append(self._take_free_block())
    ''',
    "lab2.mark_computed": '''
        before = seq.num_cached_tokens
        seq.num_cached_tokens = before + num_new_tokens
        if self.enable_prefix_caching:
            for index in range(before // self.block_size, seq.num_cached_tokens // self.block_size):
                block = self.blocks[seq.block_table[index]]
                if block.hash is None:
                    parent = self.blocks[seq.block_table[index - 1]].hash if index else None
                    block.token_ids = seq.block(index)
                    block.hash = chain_hash(block.token_ids, parent)
                    self.hash_to_block[block.hash] = block.block_id
    ''',
}
ADDED = {
    "engine/block_manager.py": '''
        def _hold(manager, block_id):
            """One more holder of a cached block; a block nobody held comes back out of the free list."""
            block = manager.blocks[block_id]
            if block.ref_count == 0:
                del manager.free_block_ids[block_id]
            block.ref_count += 1
    ''',
}
