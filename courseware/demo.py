"""`inferlab demo`: a batch of chat requests through the reference engine, with metrics.

It shows the whole lifecycle in one screen: mixed-length Chinese and English
prompts go through the chat template, are batched continuously, and each
request's queue time, TTFT, TPOT and end-to-end latency are read back from the
lifecycle log the run wrote.
"""
from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from courseware.terminal import make_console
from courseware.tiny_model import ensure_tiny_model
from courseware.trace import request_table
from reference import LLM, SamplingParams
from reference.metrics import request_metrics

DEMO_CONVERSATIONS: list[tuple[str, int]] = [
    ("你好！", 16),
    ("What is the KV cache?", 24),
    ("请用一句话解释 prefill 和 decode 的区别。", 32),
    ("Explain continuous batching to a new engineer, step by step, and say why it beats static batching "
     "when requests have very different output lengths.", 48),
    ("为什么 paged attention 可以减少显存碎片？请举一个 block table 的例子。", 40),
    ("Name three latency metrics of an inference server.", 20),
    ("推理系统的调度器在显存不足时会怎么做？", 28),
    ("Summarize: prefix caching lets requests that share a system prompt reuse the same KV blocks, so the "
     "second request skips most of its prefill and its time to first token drops.", 36),
]


# Small on purpose: with 8 requests and 4 slots, later requests queue and join the
# batch as earlier ones finish, so the table shows continuous batching at work.
DEMO_MAX_NUM_SEQS = 4


def run_demo(model: str | None, log_path: str, console: Console | None = None, **engine) -> list[dict]:
    """Run the demo batch; `engine` holds Config settings the user chose (device, tensor_parallel_size)."""
    console = console or make_console()
    started = time.perf_counter()
    model_dir = ensure_tiny_model() if model is None else Path(model)
    console.print(f"[bold]model[/bold] {model_dir}")
    llm = LLM(str(model_dir), lifecycle_log=log_path, max_num_seqs=DEMO_MAX_NUM_SEQS, **engine)
    console.print(f"[bold]device[/bold] {llm.config.device}, dtype {llm.config.torch_dtype}, "
                  f"{llm.model_runner.num_kvcache_blocks} KV blocks of {llm.config.kvcache_block_size} tokens, "
                  f"max_num_seqs={DEMO_MAX_NUM_SEQS}, tensor_parallel_size={llm.config.tensor_parallel_size}")
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 add_generation_prompt=True, tokenize=False)
               for text, _ in DEMO_CONVERSATIONS]
    params = [SamplingParams(temperature=0.0, max_tokens=n) for _, n in DEMO_CONVERSATIONS]
    outputs = llm.generate(prompts, params, use_tqdm=True)
    llm.log.close()
    metrics = request_metrics(llm.log.events)
    console.print(request_table(metrics.values()))
    for (text, _), out in zip(DEMO_CONVERSATIONS[:2], outputs[:2]):
        console.print(f"[dim]{text!r} -> {out['text'][:60]!r} (random weights: the text is noise)[/dim]")
    console.print(f"lifecycle log written to [bold]{log_path}[/bold] "
                  f"(inspect it with: inferlab trace {log_path})")
    console.print(f"done in {time.perf_counter() - started:.1f} s")
    return outputs
