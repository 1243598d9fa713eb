"""Slide "Chunked prefill": a long prompt split into budget-sized chunks, visible in the log.

    python -m slides_code.chunked_prefill
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

from slides_code._common import model_dir, parse_args, setup_torch


def main(argv: list[str] | None = None) -> dict:
    parse_args(argv, __doc__.splitlines()[0])
    setup_torch()
    from reference import LLM, SamplingParams
    model = model_dir()
    long_prompt, short_prompts = list(range(100, 200)), [list(range(300, 308)), list(range(400, 408))]

    # --- slide: Chunked prefill：每步最多 max_num_batched_tokens 个 token ---
    llm = LLM(model, device="auto", enable_chunked_prefill=True, max_num_batched_tokens=32)
    for prompt in [long_prompt, *short_prompts]:
        llm.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=3))
    while not llm.is_finished():
        llm.step()

    for e in llm.log.events:
        if e["event"] == "SCHEDULED" and e["is_prefill"]:
            start = e["num_cached_tokens"]
            print(f"step={e['step']} request_id={e['seq_id']} prefill chunk "
                  f"[{start}, {start + e['num_new_tokens']})")
        elif e["event"] == "STEP":
            print(f"step={e['step']} tokens_in_step={e['num_tokens']}")
    # --- end slide ---

    chunks = [(e["step"], e["seq_id"], e["num_cached_tokens"], e["num_new_tokens"])
              for e in llm.log.events if e["event"] == "SCHEDULED" and e["is_prefill"]]
    max_step_tokens = max(e["num_tokens"] for e in llm.log.events if e["event"] == "STEP")
    whole = LLM(model, device="auto", max_num_batched_tokens=256, max_model_len=256)
    whole.generate([long_prompt, *short_prompts], SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    unchunked_max = max(e["num_tokens"] for e in whole.log.events if e["event"] == "STEP")
    print(f"largest step: {max_step_tokens} tokens with chunking, {unchunked_max} without")
    return {"chunks": chunks, "max_step_tokens": max_step_tokens, "unchunked_max_step_tokens": unchunked_max}


if __name__ == "__main__":
    main()
