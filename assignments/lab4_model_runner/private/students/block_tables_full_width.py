"""Pads every block table to the widest any sequence could need (max_model_len), not to the longest in the batch."""
BODIES = {
    "lab4.slot": '''
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
    ''',
    "lab4.block_tables": '''
        width = -(-self.config.max_model_len // self.block_size)
        tables = np.zeros((len(seqs), width), dtype=np.int64)
        for row, seq in zip(tables, seqs):
            row[:len(seq.block_table)] = seq.block_table
        return self._tensor(tables)
    ''',
    "lab4.prepare_prefill": '''
        input_ids, positions, slot_mapping, context_lens = [], [], [], []
        cu_seqlens_q, cu_seqlens_k = [0], [0]
        for seq in seqs:
            start, end = seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens
            input_ids += seq.token_ids[start:end]
            positions += list(range(start, end))
            slot_mapping += [self._slot(seq, p) for p in range(start, end)]
            context_lens.append(end)
            cu_seqlens_q.append(cu_seqlens_q[-1] + end - start)
            cu_seqlens_k.append(cu_seqlens_k[-1] + end)
    ''',
    "lab4.prepare_decode": '''
        input_ids = [seq.last_token for seq in seqs]
        positions = [len(seq) - 1 for seq in seqs]
        slot_mapping = [self._slot(seq, len(seq) - 1) for seq in seqs]
        context_lens = [len(seq) for seq in seqs]
    ''',
    "lab4.paged_decode": '''
        batch, max_blocks = meta.block_tables.shape
        block_size = k_cache.shape[1]
        k = k_cache[meta.block_tables].flatten(1, 2)
        v = v_cache[meta.block_tables].flatten(1, 2)
        keep = torch.arange(max_blocks * block_size, device=q.device)[None, :] < meta.context_lens[:, None]
        o = _attend(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2), keep[:, None, None, :], scale)
        return o[:, :, 0, :]
    ''',
    "lab4.kv_store_kernel": '''
        token = tl.program_id(0)
        slot = tl.load(slot_ptr + token)
        if slot < 0:
            return
        offs = tl.arange(0, BLOCK)
        mask = offs < ROW
        k = tl.load(k_ptr + token * stride_k + offs, mask=mask)
        v = tl.load(v_ptr + token * stride_v + offs, mask=mask)
        tl.store(k_cache_ptr + slot.to(tl.int64) * ROW + offs, k, mask=mask)
        tl.store(v_cache_ptr + slot.to(tl.int64) * ROW + offs, v, mask=mask)
    ''',
    "lab4.graph_replay": '''
        batch = input_ids.shape[0]
        bucket = min(b for b in self.graphs if b >= batch)
        s = self.static
        s["input_ids"][:batch] = input_ids
        s["positions"][:batch] = positions
        s["slot_mapping"][:bucket].fill_(-1)
        s["slot_mapping"][:batch] = meta.slot_mapping
        s["context_lens"][:bucket].zero_()
        s["context_lens"][:batch] = meta.context_lens
        s["block_tables"][:batch, :meta.block_tables.shape[1]] = meta.block_tables
        self.graphs[bucket].replay()
        return s["hidden"][:batch]
    ''',
}
