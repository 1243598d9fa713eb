"""Slide "Prefix caching": the hash chain, and hit rates over a multi-turn chat.

    python -m slides_code.prefix_caching
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

from slides_code._common import model_dir, parse_args, setup_torch


# --- slide: hash chain：hash(前一个 block 的 hash, 本 block 的 token) ---
def block_hashes(token_ids, block_size):
    from reference.engine.block_manager import chain_hash
    hashes, prev = [], None
    for i in range(len(token_ids) // block_size):          # only full blocks are hashed
        prev = chain_hash(token_ids[i * block_size:(i + 1) * block_size], prev)
        hashes.append(prev)
    return hashes
# --- end slide ---


def main(argv: list[str] | None = None) -> dict:
    parse_args(argv, __doc__.splitlines()[0])
    setup_torch()
    from reference import LLM, SamplingParams
    tokens = list(range(1, 13))
    changed = tokens[:5] + [999] + tokens[6:]                # one token of block 1 changed
    same = [a == b for a, b in zip(block_hashes(tokens, 4), block_hashes(changed, 4))]
    print("blocks with equal hashes after changing token 5:", same)

    llm = LLM(model_dir(), device="auto", kvcache_block_size=16)
    questions = ["What is the KV cache?", "为什么 decode 比 prefill 慢？", "What does a block table store?"]
    turns = []

    # --- slide: 多轮对话的命中率 ---
    messages = [{"role": "system", "content": "You are a patient tutor who explains LLM inference step by step."}]
    for q in questions:
        messages.append({"role": "user", "content": q})
        prompt = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        n = len(llm.log.events)
        answer = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)[0]
        sched = next(e for e in llm.log.events[n:] if e["event"] == "SCHEDULED")
        prompt_len = sched["num_cached_tokens"] + sched["num_new_tokens"]
        print(f"turn {len(turns) + 1}: prompt {prompt_len} tokens, cached {sched['num_cached_tokens']} "
              f"({sched['num_cached_tokens'] / prompt_len:.0%} hit)")
        turns.append((prompt_len, sched["num_cached_tokens"]))
        messages.append({"role": "assistant", "content": answer["text"]})
    # --- end slide ---
    return {"equal_hashes": same, "turns": turns}


if __name__ == "__main__":
    main()
