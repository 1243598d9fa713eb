"""Slide "Chat template 入口": messages -> apply_chat_template -> llm.generate.

    python -m slides_code.chat_template
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
    llm = LLM(model_dir(), device="auto")

    # --- slide: Chat template 入口 ---
    messages = [
        {"role": "system", "content": "You are a patient tutor who explains LLM inference."},
        {"role": "user", "content": "什么是 KV cache？"},
    ]
    prompt = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)[0]

    print(prompt)
    print("user text:", len(llm.tokenize(messages[-1]["content"])), "tokens;",
          "templated prompt:", len(llm.tokenize(prompt)), "tokens")
    print("output token_ids:", out["token_ids"], "finish_reason:", out["finish_reason"])
    # --- end slide ---
    return {"prompt": prompt, "user_tokens": len(llm.tokenize(messages[-1]["content"])),
            "prompt_tokens": len(llm.tokenize(prompt)), "output": out}


if __name__ == "__main__":
    main()
