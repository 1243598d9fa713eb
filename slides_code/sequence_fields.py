"""Slide "Sequence 的字段": the fields that carry one request across the stages.

    python -m slides_code.sequence_fields
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

from slides_code._common import model_dir, parse_args, setup_torch


# --- slide: status、num_cached_tokens、block_table、last_block_num_tokens ---
def fields(seq) -> str:
    return (f"status={seq.status.name} num_cached_tokens={seq.num_cached_tokens} "
            f"block_table={list(seq.block_table)} last_block_num_tokens={seq.last_block_num_tokens}")
# --- end slide ---


def main(argv: list[str] | None = None) -> list[dict]:
    parse_args(argv, __doc__.splitlines()[0])
    setup_torch()
    from reference import LLM, SamplingParams
    llm = LLM(model_dir(), device="auto", kvcache_block_size=8)
    snapshots = []

    def show(stage, seq):      # every field the tests check; the slide shows the four the lecture names
        row = {"stage": stage, "status": seq.status.name, "len": len(seq),
               "num_prompt_tokens": seq.num_prompt_tokens, "num_cached_tokens": seq.num_cached_tokens,
               "num_scheduled_tokens": seq.num_scheduled_tokens, "block_table": list(seq.block_table),
               "last_block_num_tokens": seq.last_block_num_tokens,
               "output_token_ids": seq.output_token_ids, "finish_reason": seq.finish_reason}
        snapshots.append(row)
        print(f"stage={stage} " + fields(seq))

    # --- slide: 一个请求在各阶段的 Sequence 字段 ---
    seq_id = llm.add_request(list(range(100, 115)), SamplingParams(temperature=0.0, max_tokens=3))
    seq = llm.sequences[seq_id]
    show("queued", seq)        # WAITING, no blocks yet
    for stage in ("prefill", "decode", "finished"):
        llm.step()             # prefill: 2 blocks, 15 tokens cached; finished: blocks returned
        show(stage, seq)
    # --- end slide ---
    return snapshots


if __name__ == "__main__":
    main()
