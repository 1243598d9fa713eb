"""Slide "Prefill/decode 分离": prefill on engine A, hand the KV blocks to engine B, decode on B.

Two engine instances in one process stand in for a prefill node and a decode
node. The handoff moves exactly what a real system moves over the network: the
sequence's tokens, its sampling state, and the K/V of its computed tokens,
block by block, into blocks that B's own BlockManager allocated. B then decodes
as if it had done the prefill itself, and the tokens must equal a single-engine
run. Blocks that B already holds (a shared system prompt handed over earlier)
are found by B's prefix cache and not copied again.

The last listing runs the real implementation: the two engines in two
processes, the K/V sent with torch.distributed (reference.distributed).

    python -m slides_code.pd_disaggregation
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

import torch

from slides_code._common import model_dir, parse_args, setup_torch


# --- slide: KV handoff（1）：在 B 上建同一个请求 ---
def clone_for_b(seq_a, bs):
    from reference.engine.sequence import Sequence
    seq_b = Sequence(seq_a.token_ids[:seq_a.num_prompt_tokens], seq_a.sampling_params, bs,
                     arrival_time=seq_a.arrival_time, seq_id=seq_a.seq_id)
    for token in seq_a.output_token_ids:                 # the first token, sampled on A
        seq_b.append_token(token)
    seq_b.generator, seq_b.first_token_time = seq_a.generator, seq_a.first_token_time
    seq_b.first_scheduled_time = seq_a.first_scheduled_time
    return seq_b
# --- end slide ---


# --- slide: KV handoff（2）：A 的 block -> B 的 block ---
def copy_kv(a, b, seq_a, seq_b, bs):
    b.block_manager.allocate(seq_b)                      # prefix hits on B set num_cached_tokens
    computed = seq_a.num_cached_tokens                   # tokens whose K/V exist on A
    first, last = seq_b.num_cached_tokens // bs, -(-computed // bs)
    src = torch.tensor(seq_a.block_table[first:last], device=a.model_runner.kv_cache.device)
    dst = torch.tensor(seq_b.block_table[first:last], device=b.model_runner.kv_cache.device)
    # kv_cache: (2, layers, blocks, block_size, kv_heads, head_dim); copy K and V of every layer
    b.model_runner.kv_cache[:, :, dst] = a.model_runner.kv_cache[:, :, src].to(b.model_runner.kv_cache.device)
    b.block_manager.mark_computed(seq_b, computed - seq_b.num_cached_tokens)
    return first, last - first
# --- end slide ---


# --- slide: KV handoff（3）：B 接着 decode，A 释放 ---
def handoff(a, b, seq_a):
    """Move a prefilled sequence from engine A to engine B; returns (B's sequence, blocks hit, blocks copied)."""
    from reference.engine.sequence import SequenceStatus
    bs = a.config.kvcache_block_size
    seq_b = clone_for_b(seq_a, bs)
    assert b.block_manager.can_allocate(seq_b), "decode node is full: the request would wait"
    hit, copied = copy_kv(a, b, seq_a, seq_b, bs)
    seq_b.status = SequenceStatus.RUNNING                # straight into B's running queue: decode next
    b.scheduler.running.append(seq_b)
    b.sequences[seq_b.seq_id] = seq_b
    a.scheduler.finish(seq_a)                            # A frees its blocks (their prefix stays cached)
    del a.sequences[seq_a.seq_id]
    return seq_b, hit, copied
# --- end slide ---


def main(argv: list[str] | None = None) -> dict:
    parse_args(argv, __doc__.splitlines()[0])
    setup_torch()
    from reference import LLM, SamplingParams
    from reference.metrics import check_lifecycle
    model = model_dir()
    system = list(range(1, 41))                           # a 40-token shared "system prompt"
    prompts = [system + [101, 102, 103], system + [201, 202, 203, 204, 205], list(range(300, 330))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    config = dict(device="auto", kvcache_block_size=16, num_kvcache_blocks=64)

    # --- slide: Prefill 在 A，decode 在 B ---
    a, b = LLM(model, **config), LLM(model, **config)     # "prefill node" and "decode node"
    transfers = []
    ids = [a.add_request(p, params) for p in prompts]
    while any(a.sequences[i].num_output_tokens == 0 for i in ids):
        a.step()                                          # prefill only: stop at the first token
    for i in ids:
        seq_b, hit, copied = handoff(a, b, a.sequences[i])
        kib = copied * b.model_runner.kv_cache[:, :, 0].nbytes / 1024
        print(f"request {i}: {hit} blocks already on B, {copied} copied ({kib:.0f} KiB)")
        transfers.append((hit, copied))
    while not b.is_finished():
        b.step()                                          # decode only
    disaggregated = [b.finished.pop(i).output_token_ids for i in ids]
    # --- end slide ---

    single = LLM(model, **config).generate(prompts, params, use_tqdm=False)
    same = disaggregated == [o["token_ids"] for o in single]
    print("tokens equal to a single-engine run:", same)

    # One request's lifecycle now spans two logs: A's up to its first token, then B's.
    merged = [e for e in a.log.events if e["seq_id"] in ids] + [e for e in b.log.events if e["seq_id"] in ids]
    problems = check_lifecycle(sorted(merged, key=lambda e: e["time"]))
    print("merged A+B lifecycle log is legal:", problems == [])
    b_phases = {e["is_prefill"] for e in b.log.events if e["event"] == "STEP"}
    print("engine B ran prefill steps:", True in b_phases)

    # Control: the same handoff with B's cache wiped before decoding must go wrong,
    # or the comparison above would not prove that the copied K/V were used.
    a2, b2 = LLM(model, **config), LLM(model, **config)
    ids2 = [a2.add_request(p, params) for p in prompts]
    while any(a2.sequences[i].num_output_tokens == 0 for i in ids2):
        a2.step()
    for i in ids2:
        handoff(a2, b2, a2.sequences[i])
    b2.model_runner.kv_cache.zero_()
    while not b2.is_finished():
        b2.step()
    control_differs = [b2.finished.pop(i).output_token_ids for i in ids2] != disaggregated
    print("control: with B's KV wiped the tokens differ:", control_differs)
    processes = run_in_two_processes(model, prompts, params, config)
    return {"tokens_equal": same, "processes_tokens_equal": processes["tokens_equal"],
            "processes_kv_bytes": processes["kv_bytes"], "control_differs": control_differs, "transfers": transfers, "lifecycle_problems": problems, "b_ran_prefill": True in b_phases,
            "a_blocks_in_use": a.block_manager.num_used_blocks, "outputs": disaggregated}


def run_in_two_processes(model, prompts, params, config) -> dict:
    from reference import LLM
    from reference.distributed.disaggregation import DisaggregatedLLM
    single = LLM(model, **config).generate(prompts, params, use_tqdm=False)
    # --- slide: 真实实现：两个进程，KV 走 torch.distributed ---
    pd = DisaggregatedLLM(model, **config)       # prefill process (GPU 0) + decode process (GPU 1)
    try:
        # Request 0 first: D can serve request 1's shared prefix from its cache only once
        # request 0's K/V have landed there. Sent together, that depends on timing.
        results = pd.generate(prompts[:1], params) + pd.generate(prompts[1:], params)
        sent = [e for e in pd.logs()["prefill"] if e["event"] == "KV_SENT"]
    finally:
        pd.close()
    for e in sent:
        print(f"KV_SENT request {e['seq_id']}: {e['blocks']} blocks, {e['bytes'] / 1024:.0f} KiB, "
              f"{e['seconds'] * 1e3:.2f} ms")
    same = [r["token_ids"] for r in results] == [o["token_ids"] for o in single]
    print("two processes: tokens equal to a single-engine run:", same)
    # --- end slide ---
    return {"tokens_equal": same, "kv_bytes": [r["kv_bytes"] for r in results]}


if __name__ == "__main__":
    main()
