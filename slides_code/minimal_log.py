"""Slide "最小日志": one line per request and stage, read from the engine's lifecycle log.

    python -m slides_code.minimal_log
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

from slides_code._common import model_dir, parse_args, setup_torch


def main(argv: list[str] | None = None) -> list[str]:
    parse_args(argv, __doc__.splitlines()[0])
    setup_torch()
    from reference import LLM, SamplingParams
    model = model_dir()
    prompts = ["你好！", "What is the KV cache?", "请解释 prefill 和 decode。"]

    # --- slide: 最小日志：request id、prompt 长度、stage ---
    llm = LLM(model, device="auto", max_num_seqs=2)
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)

    prompt_len, lines = {}, []
    for e in llm.log.events:
        if e["event"] == "ARRIVED":
            prompt_len[e["seq_id"]] = e["prompt_len"]
        elif e["event"] in ("SCHEDULED", "FINISHED"):
            stage = ("prefill" if e["is_prefill"] else "decode") if e["event"] == "SCHEDULED" else "finished"
            lines.append(f"step={e['step']} request_id={e['seq_id']} "
                         f"prompt_len={prompt_len[e['seq_id']]} stage={stage}")
    print("\n".join(lines))
    # --- end slide ---

    # --- slide: 最小日志：每一步的 batch_size 与 running_size ---
    for e in llm.log.events:
        if e["event"] == "STEP":
            batch_size, running_size = e["batch_size"], e["num_running"]
            print(f"step={e['step']}", batch_size, running_size)
    # --- end slide ---
    return lines


if __name__ == "__main__":
    main()
