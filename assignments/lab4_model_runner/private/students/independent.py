"""Right: inputs built token by token from the handout's example, decode attention one sequence at a time."""
RIGHT = True
BODIES = {
    "lab4.slot": '''
        logical, offset = divmod(position, self.block_size)
        return seq.block_table[logical] * self.block_size + offset
    ''',
    "lab4.block_tables": '''
        longest = max(len(seq.block_table) for seq in seqs)
        rows = [seq.block_table + [0] * (longest - len(seq.block_table)) for seq in seqs]
        return self._tensor(np.array(rows, dtype=np.int64).reshape(len(seqs), longest))
    ''',
    "lab4.prepare_prefill": '''
        input_ids, positions, slot_mapping, context_lens = [], [], [], []
        cu_seqlens_q, cu_seqlens_k = [0], [0]
        for seq in seqs:
            first = seq.num_cached_tokens
            last = first + seq.num_scheduled_tokens
            for position in range(first, last):
                input_ids.append(seq.token_ids[position])
                positions.append(position)
                slot_mapping.append(self._slot(seq, position))
            context_lens.append(last)
            cu_seqlens_q.append(cu_seqlens_q[-1] + (last - first))
            cu_seqlens_k.append(cu_seqlens_k[-1] + last)
    ''',
    "lab4.prepare_decode": '''
        input_ids, positions, slot_mapping, context_lens = [], [], [], []
        for seq in seqs:
            newest = len(seq) - 1
            input_ids.append(seq.token_ids[newest])
            positions.append(newest)
            slot_mapping.append(self._slot(seq, newest))
            context_lens.append(newest + 1)
    ''',
    "lab4.paged_decode": '''
        outputs = []
        for i, length in enumerate(meta.context_lens.tolist()):
            k = gather_kv(k_cache, meta.block_tables[i], length)      # [length, Hkv, D]
            v = gather_kv(v_cache, meta.block_tables[i], length)
            visible = torch.ones(1, length, dtype=torch.bool, device=q.device)
            o = _attend(q[i][:, None, :], k.transpose(0, 1), v.transpose(0, 1), visible, scale)
            outputs.append(o[:, 0, :])
        return torch.stack(outputs)
    ''',
    "lab4.kv_store_kernel": '''
        token = tl.program_id(0)
        slot = tl.load(slot_ptr + token).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        keep = (lanes < ROW) & (slot >= 0)          # padding rows (slot -1) write nothing
        k = tl.load(k_ptr + token * stride_k + lanes, mask=keep)
        v = tl.load(v_ptr + token * stride_v + lanes, mask=keep)
        tl.store(k_cache_ptr + slot * ROW + lanes, k, mask=keep)
        tl.store(v_cache_ptr + slot * ROW + lanes, v, mask=keep)
    ''',
    "lab4.graph_replay": '''
        rows = input_ids.shape[0]
        graph_rows = min(size for size in self.graphs if size >= rows)
        buffers = self.static
        buffers["slot_mapping"][rows:graph_rows] = -1
        buffers["context_lens"][rows:graph_rows] = 0
        buffers["input_ids"][:rows].copy_(input_ids)
        buffers["positions"][:rows].copy_(positions)
        buffers["slot_mapping"][:rows].copy_(meta.slot_mapping)
        buffers["context_lens"][:rows].copy_(meta.context_lens)
        buffers["block_tables"][:rows, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.graphs[graph_rows].replay()
        return buffers["hidden"][:rows]
    ''',
}
