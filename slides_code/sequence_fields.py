"""Slide "Sequence 的字段": the fields that carry one request across the stages.

    python -m slides_code.sequence_fields
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

from slides_code._common import model_dir, parse_args, setup_torch


def main(argv: list[str] | None = None) -> list[dict]:
    parse_args(argv, __doc__.splitlines()[0])
    setup_torch()
    from reference import LLM, SamplingParams
    llm = LLM(model_dir(), device="auto", kvcache_block_size=8)
    snapshots = []

    # --- slide: 一个请求在各阶段的 Sequence 字段 ---
    def show(stage, seq):
        row = {"stage": stage, "status": seq.status.name, "len": len(seq),
               "num_prompt_tokens": seq.num_prompt_tokens, "num_cached_tokens": seq.num_cached_tokens,
               "num_scheduled_tokens": seq.num_scheduled_tokens, "block_table": list(seq.block_table),
               "output_token_ids": seq.output_token_ids, "finish_reason": seq.finish_reason}
        snapshots.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()))

    seq_id = llm.add_request(list(range(100, 115)), SamplingParams(temperature=0.0, max_tokens=3))
    seq = llm.sequences[seq_id]
    show("queued", seq)        # WAITING, no blocks yet
    llm.step()
    show("prefill", seq)       # RUNNING, 2 blocks, 15 tokens cached, first token appended
    llm.step()
    show("decode", seq)        # one more token; its K/V are computed next step
    llm.step()
    show("finished", seq)      # FINISHED, blocks returned to the pool
    # --- end slide ---
    return snapshots


if __name__ == "__main__":
    main()
