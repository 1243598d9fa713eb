"""Tensor parallelism on the CPU (gloo): TP=2 greedy tokens equal TP=1 and transformers.

Spawning a rank costs seconds, so each model gets one TP=2 engine for all its
checks. Two shapes: the tiny model (2 KV heads: one per rank) and one with 4
KV heads and 8 query heads (2 KV heads and 4 query heads per rank), so a
mix-up of heads between ranks cannot hide behind a shape where it is harmless.
"""
from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from reference import LLM, SamplingParams
from reference.config import Config
from courseware.oracle import hf_greedy, random_prompts

MAX_NEW = 12
LENGTHS = [1, 7, 16, 33]
CONFIG = dict(device="cpu", dtype="float32", num_kvcache_blocks=64, max_model_len=256, max_num_batched_tokens=256)
WIDE_SHAPE = dict(vocab_size=None, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=16, max_position_embeddings=4096, rope_theta=10000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def wide_kv_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """4 KV heads, separate lm_head (so the vocab-parallel head is loaded on its own), the tiny tokenizer,
    and an odd vocabulary (3 ids past the tokenizer's, as Qwen pads its own): rank 1's slice of the head is
    padded, and the padding's zero logits must never win an argmax."""
    from courseware.bench import make_random_model
    vocab = json.loads(open(f"{tiny_model_dir}/config.json").read())["vocab_size"] + 3
    shape = {**WIDE_SHAPE, "vocab_size": vocab}
    return str(make_random_model(tmp_path_factory.mktemp("wide") / "model", shape=shape, seed=3, dtype=torch.float32))


def greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]


def prompts_for(model_dir: str) -> list[list[int]]:
    vocab = json.loads(open(f"{model_dir}/config.json").read())["vocab_size"]
    return random_prompts(LENGTHS, vocab, seed=5)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def check_tp2_matches(model_dir: str, llm: LLM) -> None:
    prompts = prompts_for(model_dir)
    tp2 = greedy(llm, prompts)
    tp1 = greedy(LLM(model_dir, **CONFIG), prompts)
    assert tp2 == tp1, "TP=2 tokens differ from TP=1"
    for prompt, tokens in zip(prompts, tp2):
        assert tokens == hf_greedy(model_dir, prompt, MAX_NEW), f"prompt of length {len(prompt)} differs from transformers"


def test_tp2_tiny_model_equals_tp1_and_transformers_and_a_dead_worker_is_an_error(tiny_model_dir):
    llm = LLM(tiny_model_dir, tensor_parallel_size=2, **CONFIG)
    pids = [p.pid for p in llm.model_runner.workers]
    try:
        assert llm.model_runner.model.model.layers[0].self_attn.num_kv_heads == 1   # really split
        check_tp2_matches(tiny_model_dir, llm)
        worker = llm.model_runner.workers[0]     # a worker dies: the next step says so instead of hanging
        worker.kill()
        worker.join(5)
        with pytest.raises(RuntimeError, match="worker .* exited"):
            greedy(llm, [[1, 2, 3]])
    finally:
        llm.model_runner.close()
    assert not any(alive(pid) for pid in pids), "close() left a worker process running"


def test_tp2_wide_kv_model_and_cleanup_on_garbage_collection(wide_kv_model_dir):
    """Async scheduling: every step is greedy, so each rank takes its vocabulary slice's argmax."""
    llm = LLM(wide_kv_model_dir, tensor_parallel_size=2, async_scheduling=True, **CONFIG)
    pids = [p.pid for p in llm.model_runner.workers]
    attn = llm.model_runner.model.model.layers[0].self_attn
    assert (attn.num_heads, attn.num_kv_heads) == (4, 2)
    model, calls = llm.model_runner.model, []
    plain = model.greedy_tokens
    model.greedy_tokens = lambda hidden: calls.append(len(hidden)) or plain(hidden)
    check_tp2_matches(wide_kv_model_dir, llm)
    assert calls, "no step took the vocabulary-parallel argmax"
    del llm, attn, model, plain
    gc.collect()
    assert not any(alive(pid) for pid in pids), "garbage-collecting the LLM left a worker process running"


def test_kv_heads_not_divisible_is_a_clear_error(tiny_model_dir):
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4.*num_key_value_heads=2"):
        Config(tiny_model_dir, device="cpu", tensor_parallel_size=4)


CHILD = """
import sys, time
from reference import LLM
llm = LLM(sys.argv[1], device="cpu", tensor_parallel_size=2, num_kvcache_blocks=16)
print(*[p.pid for p in llm.model_runner.workers], flush=True)
time.sleep(120)
"""


def test_ctrl_c_or_kill_of_the_engine_process_leaves_no_worker(tiny_model_dir):
    """Ctrl-C: the exit hook stops the workers. kill -9: no hook runs; the workers' watchdog must."""
    children = {sig: subprocess.Popen([sys.executable, "-c", CHILD, tiny_model_dir], stdout=subprocess.PIPE, text=True)
                for sig in (signal.SIGINT, signal.SIGKILL)}
    try:
        workers = {sig: [int(pid) for pid in child.stdout.readline().split()] for sig, child in children.items()}
        for sig, child in children.items():
            assert workers[sig], f"the engine process died before starting its worker (rc {child.poll()})"
            child.send_signal(sig)
            child.wait(30)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pids in workers.values() for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        for sig, pids in workers.items():
            assert not any(alive(pid) for pid in pids), f"a worker outlived its engine after {sig.name}"
    finally:
        for child in children.values():
            child.kill()
            child.wait()


def test_cli_takes_tensor_parallel_size_for_demo_bench_and_serve():
    from inferlab.cli import build_parser
    parser = build_parser()
    for command in (["demo"], ["bench", "--scheduling", "async"], ["serve"]):
        assert parser.parse_args([*command, "--tensor-parallel-size", "2"]).tensor_parallel_size == 2


def test_async_scheduling_under_tp2_gives_tp1s_tokens_greedy_and_seeded(tiny_model_dir):
    """Rank 0 samples on the device and broadcasts the ids; the worker's next step reads them as inputs.
    The seeded requests stop first, so the later steps are all greedy and take the other path (every rank
    its own argmax), feeding on tokens the broadcast path produced."""
    prompts = prompts_for(tiny_model_dir)
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
              SamplingParams(temperature=0.9, top_k=20, seed=11, max_tokens=MAX_NEW // 2, ignore_eos=True)] * 2
    llm = LLM(tiny_model_dir, tensor_parallel_size=2, async_scheduling=True, **CONFIG)
    try:
        tp2 = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        llm.model_runner.close()
    tp1 = [o["token_ids"] for o in LLM(tiny_model_dir, async_scheduling=True, **CONFIG).generate(prompts, params,
                                                                                                use_tqdm=False)]
    assert tp2 == tp1


def test_tp2_chunked_prefill_mixing_a_sampled_chunk_with_greedy_rows(tiny_model_dir):
    """A prefill step where the only rows that sample are greedy, beside a sampled request's chunk that stops
    short of its prompt's end: every rank must choose the same way to get its tokens (here: each rank's own
    argmax), or the ranks wait in different collectives."""
    config = {**CONFIG, "max_num_batched_tokens": 48, "enable_chunked_prefill": True, "async_scheduling": True}
    vocab = json.loads(open(f"{tiny_model_dir}/config.json").read())["vocab_size"]
    prompts = random_prompts([9, 11, 100], vocab, seed=4)      # step 1: 9 + 11 + the long one's first 28 tokens
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
              SamplingParams(temperature=0.9, seed=3, max_tokens=MAX_NEW, ignore_eos=True)]
    llm = LLM(tiny_model_dir, tensor_parallel_size=2, **config)
    try:
        tp2 = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        llm.model_runner.close()
    tp1 = [o["token_ids"] for o in LLM(tiny_model_dir, **config).generate(prompts, params, use_tqdm=False)]
    assert tp2 == tp1


def test_tp2_greedy_request_with_logprobs_gets_them(tiny_model_dir):
    """Log-probabilities need whole rows of logits: a greedy request that asks for them keeps the all-gather
    (only an argmax can be taken slice by slice); its tokens and log-probabilities are TP=1's."""
    prompts = prompts_for(tiny_model_dir)[:2]
    params = [SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)]
    llm = LLM(tiny_model_dir, tensor_parallel_size=2, **CONFIG)
    try:
        tp2 = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.model_runner.close()
    tp1 = LLM(tiny_model_dir, **CONFIG).generate(prompts, params, use_tqdm=False)
    assert [o["token_ids"] for o in tp2] == [o["token_ids"] for o in tp1]
    assert len(tp2[0]["logprobs"]) == 5 and "logprobs" not in tp2[1]
    for mine, theirs in zip(tp2[0]["logprobs"], tp1[0]["logprobs"]):
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-5)
        assert [i for i, _ in mine.top] == [i for i, _ in theirs.top]


def test_tp2_under_preemption_gives_tp1s_tokens(tiny_model_dir):
    """A KV pool too small for the batch: sequences are preempted and prefilled again with new block tables,
    which the worker must take whole (a decode step sends it only a table's new entries)."""
    config = {**CONFIG, "num_kvcache_blocks": 7, "async_scheduling": True}
    vocab = json.loads(open(f"{tiny_model_dir}/config.json").read())["vocab_size"]
    prompts = random_prompts([15] * 6, vocab, seed=9)       # one block each, a second one each at token 17
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    llm = LLM(tiny_model_dir, tensor_parallel_size=2, **config)
    preempted = []
    plain = llm.scheduler.preempt
    llm.scheduler.preempt = lambda seq: preempted.append(seq.seq_id) or plain(seq)
    try:
        tp2 = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        llm.model_runner.close()
    assert preempted, "the pool was meant to be too small: nothing was preempted"
    tp1 = [o["token_ids"] for o in LLM(tiny_model_dir, **config).generate(prompts, params, use_tqdm=False)]
    assert tp2 == tp1


LIFECYCLE = """
import gc, sys
from reference import LLM, SamplingParams
from reference.engine.model_runner import EngineDeadError
model, device = sys.argv[1], sys.argv[2]
config = dict(device=device, tensor_parallel_size=2, max_model_len=128, max_num_batched_tokens=128, max_num_seqs=4,
              num_kvcache_blocks=32)
params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

def start():
    llm = LLM(model, **config)
    print("workers", *[p.pid for p in llm.model_runner.workers], flush=True)
    assert len(llm.generate([[1, 2, 3]], params, use_tqdm=False)[0]["token_ids"]) == 4
    return llm

llm = start()                                  # 1: dropped: garbage collection stops it
del llm
gc.collect()
llm = start()                                  # 2: a step fails on rank 0 after the workers were sent it
def broken(*args):
    raise RuntimeError("injected")
llm.model_runner.model.compute_logits = llm.model_runner.model.greedy_tokens = broken   # whichever the step takes
out = llm.generate([[4, 5, 6]], params, use_tqdm=False)[0]
assert out["finish_reason"] == "error", out
try:
    llm.generate([[4, 5, 6]], params, use_tqdm=False)
    raise AssertionError("a stopped engine served a request")
except EngineDeadError:
    pass
llm = start()                                  # 3: still alive when the interpreter exits
print("done", flush=True)
"""


def run_lifecycle(model_dir: str, device: str, timeout: float) -> None:
    """Three TP=2 engines in one process: dropped, failed mid-step, alive at exit; no hang, no worker left."""
    child = subprocess.run([sys.executable, "-c", LIFECYCLE, model_dir, device], capture_output=True, text=True,
                           timeout=timeout)
    assert child.returncode == 0 and "done" in child.stdout, child.stdout + child.stderr[-3000:]
    pids = [int(pid) for line in child.stdout.splitlines() if line.startswith("workers") for pid in line.split()[1:]]
    assert len(pids) == 3
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids), "a worker outlived its engine"


def test_three_tp2_engines_in_one_process_start_and_stop_cleanly_cpu(tiny_model_dir):
    run_lifecycle(tiny_model_dir, "cpu", timeout=150)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_three_tp2_engines_in_one_process_start_and_stop_cleanly_gpu(tiny_model_dir):
    """NCCL with CUDA graphs: leaving the group with graphs alive hung the exit (issue 35). With max_num_seqs 4
    the prefill graphs' pieces all-reduce through NCCL (their buckets exceed the one-shot buffer's 4 rows)."""
    run_lifecycle(tiny_model_dir, "cuda", timeout=240)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_on_two_gpus_gives_tp1s_greedy_tokens_gpu(wide_kv_model_dir):
    """fp32 on two GPUs, async scheduling, CUDA graphs, the one-shot all-reduce: each rank's argmax of its
    vocabulary slice (the Triton kernel reading a slice whose rows are longer than it, the last one padded)
    must give the single GPU's greedy tokens. With max_num_seqs 4 a decode step all-reduces through the
    one-shot kernel and a prefill step (bucket 64) through NCCL captured in the prefill graphs' pieces."""
    config = {**CONFIG, "device": "cuda", "async_scheduling": True, "max_num_seqs": 4}
    prompts = prompts_for(wide_kv_model_dir)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    llm = LLM(wide_kv_model_dir, tensor_parallel_size=2, **config)
    try:
        assert llm.model_runner.graphs, "the TP=2 engine captured no decode graphs"
        assert llm.model_runner.prefill_graphs is not None, "the TP=2 engine captured no prefill graphs"
        tp2 = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        llm.model_runner.close()
    tp1 = [o["token_ids"] for o in LLM(wide_kv_model_dir, **config).generate(prompts, params, use_tqdm=False)]
    assert tp2 == tp1


def test_teardown_drops_decode_and_prefill_graphs_before_leaving_the_group(monkeypatch, tmp_path):
    """NCCL will not destroy a communicator while a graph that captured one of its collectives lives (the
    exit hang of issue 35): every graph the runner holds (`ModelRunner.graph_sets`: decode, and prefill,
    whose pieces all-reduce through NCCL) must be gone when the group is left."""
    from types import SimpleNamespace
    from reference.distributed import tp_runner
    from reference.engine.model_runner import ModelRunner
    runner = ModelRunner.__new__(ModelRunner)
    assert runner.graph_sets() == [], "a runner that failed before building anything holds no graphs"
    runner.graphs = {4: "a decode graph"}
    runner.prefill_graphs = SimpleNamespace(graphs={64: ["a prefill piece"]})
    at_destroy = []
    monkeypatch.setattr(tp_runner.parallel_state, "destroy_tensor_parallel",
                        lambda abort=False: at_destroy.append([dict(graphs) for graphs in runner.graph_sets()]))
    teardown = tp_runner._Teardown([], SimpleNamespace(send=lambda *a, **k: True, close=lambda: None),
                                   str(tmp_path), "cpu")
    teardown.graph_sets = runner.graph_sets()
    teardown()
    assert at_destroy == [[{}, {}]], f"graphs still held when the group was left: {at_destroy}"
    assert teardown.done


def test_no_process_left_behind():
    assert multiprocessing.active_children() == []
