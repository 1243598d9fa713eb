"""Timed runs of one engine, on command (copied into harnesses as `_inferlab_throughput.py`).

    python -I -B _inferlab_throughput.py WORKLOAD      (cwd: the harness)

The grader starts one of these on the student's harness and one on the
reference harness, and alternates between them: it writes `RUN <seed>` to
one, waits for `DONE <digest>`, then the other, and so on. It times each run
itself, from writing the command to reading the answer, so this process
cannot report a time; the seed is chosen by the grader for each round, so a
run cannot be prepared in advance; and the digest of the greedy tokens must
equal the reference's for the same seed, so a fast wrong answer does not count.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # -I leaves the script's folder off sys.path

import _inferlab_boot  # noqa: E402

_inferlab_boot.fence()

import _inferlab_support as support  # noqa: E402  (after the fence, like every import of student code)

WORKLOADS = {
    # name: (requests, prefixes, prefix_len, max_prompt, max_tokens, engine config)
    "lab1": (60, 3, 8, 24, 8, dict(kvcache_block_size=8, num_kvcache_blocks=128, max_num_seqs=16)),
    "lab2": (150, 5, 12, 30, 6, dict(kvcache_block_size=4, num_kvcache_blocks=96, max_num_seqs=24)),
    "lab3": (120, 4, 8, 40, 8, dict(kvcache_block_size=4, num_kvcache_blocks=64, max_num_seqs=16)),
    "lab4": (60, 3, 8, 40, 12, dict(kvcache_block_size=8, num_kvcache_blocks=128, max_num_seqs=16,
                                    attention_backend="torch")),
}


def run(workload: str, seed: int) -> str:
    n, prefixes, prefix_len, max_prompt, max_tokens, config = WORKLOADS[workload]
    requests = support.shared_prefix_workload(seed, n, prefixes, prefix_len, max_prompt, max_tokens)
    engine = support.module("engine.llm_engine").LLMEngine(
        support.model_dir(), device="cpu", max_num_batched_tokens=512, max_model_len=128, **config)
    params_cls = support.module("sampling_params").SamplingParams
    ids = [engine.add_request(prompt, params_cls(**params)) for prompt, params in requests]
    while not engine.is_finished():
        engine.step()
    tokens = [engine.finished[i].output_token_ids for i in ids]
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()


def main() -> int:
    workload = sys.argv[1]
    run(workload, random.Random(0).randrange(1 << 30))          # warm-up, untimed
    print("READY", flush=True)
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "EXIT":
            break
        if command[0] == "RUN":
            print(f"DONE {run(workload, int(command[1]))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
