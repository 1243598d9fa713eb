"""Tensor parallelism and prefill/decode disaggregation on a 2-GPU machine: checks and figures.

Run by scripts/gpu_tp.sh; every part is independent (a failure is recorded and
the next part runs) and the whole run keeps to a time budget. Writes
$OUT/gpu_tp.json and prints a table at the end.

Parts (GPU_TP_PARTS picks some; by default `env,allreduce,tp_bench,small`, about 6.5 minutes on two
H100s; `gpu_tests,pd,serve` is the second call, about 7 minutes; docs/performance.md has both):
  env          GPUs, how they are linked, peer access, versions, the NVLink multicast variables
  allreduce    one all-reduce of a decode step's activations: NCCL eager / in a CUDA graph, the one-shot
               all-reduce eager / in a graph (results checked against NCCL's); the GPU-to-GPU copy and
               NCCL send/recv bandwidth; step inputs as pickles over gloo vs the shared-memory channel;
               unless GPU_TP_AR_PROBES=0, the one-shot kernels on other grids and warps, and a decode
               step's GEMMs and all-reduces with the next weight prefetched into L2 (scripts/l2_prefetch.py)
  gpu_tests    the gpu-marked tests of tests/distributed (the one-shot all-reduce; three TP=2 engines made
               and dropped in one process under a timeout; TP=2 against TP=1 tokens in fp32; P/D on the GPU)
  tp_bench     Qwen3-8B shape (random bf16): TP=1, TP=2 (one-shot all-reduce), TP=2 with NCCL's
               (GPU_TP_NCCL_VARIANT=1);
               decode batch 64 and 256 (prompt 128, output 256 tokens, every request at once), three runs
               each with async scheduling, one with sync; per run the steps before the batch is full, the
               decode graphs by the GPU's clock, the slow steps; where a decode step's and a prefill step's
               GPU time goes (profiler)
  small        the same on the Qwen3-0.6B shape, eager TP=1 vs TP=2, and bf16 TP=2 vs TP=1 tokens
  pd           colocated engine vs prefill GPU + decode GPU (Qwen3-8B shape): TTFT, TPOT, throughput, KV transfer
  kvlink       the P/D handoff's own bandwidth (the engine's gather + send, receive + scatter, on the GPUs'
               clocks) at 10, 64 and 256 blocks of the 8B shape, against NCCL send/recv and a peer copy;
               GPU_TP_KV_WORDS=0: with the blocks copied in the cache's dtype, as before kv_transfer.as_words
  serve        `inferlab serve` at TP=1 and TP=2 (Qwen3-8B shape), `inferlab bench serve` over request rates
  before       the engine before issue 35 (GPU_TP_OLD: a copy of that tree) at TP=2, sync, graphs: decode batch 64, 256

GPU_TP_WORKER_TRACE=1: the TP workers log their slow steps and garbage collections (scripts/tp_worker_trace.py).
"""
from __future__ import annotations

import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from courseware.bench import QWEN3_0_6B, make_random_model, make_workload, random_model_dir  # noqa: E402
import tp_worker_trace  # noqa: E402   (this script's directory is sys.path[0])
from tp_worker_trace import Pauses  # noqa: E402

QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
BUDGET_S = float(os.environ.get("GPU_TP_BUDGET_S", 500))
START = time.monotonic()
OUT = Path(os.environ.get("OUT", "gpu_tp_out"))
RESULTS: dict = {}
PROMPT_LEN, OUTPUT_LEN, BATCHES = 128, 256, (64, 256)
REPS = int(os.environ.get("GPU_TP_REPS", 3))
# GPU_TP_TRACE=1: also write a Chrome trace (host and device) of a few full-batch decode steps per engine and
# batch to $OUT/trace_tp{N}_b{B}.json, to see what the host is doing while the GPU waits.
TRACE = os.environ.get("GPU_TP_TRACE") == "1"
ENGINE = dict(device="cuda", dtype="bfloat16", max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=512,
              async_scheduling=True)


def log(message: str) -> None:
    print(f"[{time.monotonic() - START:6.1f} s] {message}", flush=True)


def free_gpu() -> None:
    """Engines of earlier parts must give their memory back before the next one sizes its KV pool."""
    gc.collect()
    torch.cuda.empty_cache()


def save() -> None:
    (OUT / "gpu_tp.json").write_text(json.dumps(RESULTS, indent=2, default=str))


def part(name: str, min_left_s: float):
    def wrap(fn):
        def run():
            left = BUDGET_S - (time.monotonic() - START)
            if left < min_left_s:
                RESULTS[name] = {"skipped": f"{left:.0f} s of the budget left, needs {min_left_s:.0f}"}
                log(f"== {name}: skipped ({left:.0f} s left)")
                return
            t0 = time.monotonic()
            log(f"== {name}: start")
            try:
                RESULTS[name] = fn()
            except Exception:
                RESULTS[name] = {**RESULTS.get(name, {}), "error": traceback.format_exc()[-3000:]}
            RESULTS[name]["part_seconds"] = round(time.monotonic() - t0, 1)
            log(f"== {name}: {json.dumps(RESULTS[name], default=str)[:2000]}")
            free_gpu()
            save()
        run.__name__ = name
        return run
    return wrap


# -- env ---------------------------------------------------------------------------------------
@part("env", 5)
def env() -> dict:
    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"torch": torch.__version__, "nccl": nccl, "triton": triton_version,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "peer_access_0_1": torch.cuda.can_device_access_peer(0, 1), "topology": topo,
            "multicast_env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                              "NVSHMEM_DISABLE_NVLS")}}


# -- allreduce ---------------------------------------------------------------------------------
def _time_cuda(fn, iters: int) -> float:
    """Milliseconds per call, by CUDA events, after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _graph_of(fn, calls: int) -> torch.cuda.CUDAGraph:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def _launch_shape_sweep(custom, x: torch.Tensor, per_graph: int) -> dict:
    """The plain one-shot kernel at several (BLOCK, num_warps), the default (BLOCK, WARPS) among them: µs per call in a graph."""
    from reference.kernels.all_reduce import one_shot_all_reduce
    out = {}
    for block, warps in ((2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16), (8192, 32)):
        call = lambda: one_shot_all_reduce(x, custom.addrs, custom.epochs, custom.error, custom.rank, custom.world,
                                           custom.max_bytes, shape=(block, warps))
        graph = _graph_of(call, per_graph)
        out[f"{block}x{warps}"] = round(_time_cuda(graph.replay, 10) * 1e3 / per_graph, 2)
        del graph
    return out


def _fused_norm_probe(custom, tokens: int, hidden: int, per_graph: int) -> tuple[float, dict]:
    """The all-reduce with the add and RMSNorm fused in: µs per call in a graph, and its output against
    the two steps (all-reduce with the add, then the eager norm) on the same inputs."""
    from reference.models.qwen3 import rms_norm
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    residual = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    weight = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
    graph = _graph_of(lambda: custom.add_norm(x, residual, weight, 1e-6), per_graph)
    us = _time_cuda(graph.replay, 10) * 1e3 / per_graph
    del graph
    x.normal_()
    residual.normal_()
    x2, r2 = x.clone(), residual.clone()
    stream, normed = custom.add_norm(x, residual, weight, 1e-6)
    custom(x2, residual=r2)
    want = rms_norm(r2, weight, 1e-6)
    torch.cuda.synchronize()
    return round(us, 2), {"stream_equal": bool(torch.equal(stream, r2)),
                          "normed_equal_fraction": float((normed == want).float().mean()),
                          "normed_max_abs_diff": float((normed.float() - want.float()).abs().max())}


def _grid_sweep(rank: int, control, hidden: int, per_graph: int) -> dict:
    """Both one-shot kernels on grids of 1, 2 and 4 programs per SM (128 is the engine's): µs per call in a graph
    of `per_graph`, plain at several (BLOCK, warps), fused norm at several warps; each grid's plain sum
    checked against NCCL's."""
    import torch.distributed as dist
    from reference.distributed.custom_all_reduce import OneShotAllReduce
    from reference.kernels.all_reduce import one_shot_all_reduce, one_shot_all_reduce_norm
    sms = torch.cuda.get_device_properties(rank).multi_processor_count
    out: dict = {}
    for programs in (128, 2 * sms, 4 * sms):
        custom = OneShotAllReduce(rank, 2, torch.bfloat16, 256 * hidden * 2, control, programs=programs)
        args = (custom.addrs, custom.epochs, custom.error, rank, 2, custom.max_bytes)
        wait_s = 1.0     # a grid that cannot be resident at once gives up in 1 s, and fails the check
        row: dict = {}
        per_sm = -(-programs // sms)
        for tokens in (64, 256):
            x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
            residual = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
            weight = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)

            def timed(name: str, call) -> None:   # a config that gave up waiting is marked, and the flag cleared
                graph = _graph_of(call, per_graph)
                us = round(_time_cuda(graph.replay, 10) * 1e3 / per_graph, 2)
                del graph
                torch.cuda.synchronize()
                gave_up = int(custom.error.item())
                custom.error.zero_()
                row[name] = us if not gave_up else f"gave up ({us})"
            for block, warps in ((2048, 8), (2048, 4), (1024, 4)):
                if warps * per_sm <= 16:      # every program resident at once (a waiting one holds its slot)
                    timed(f"t{tokens}_plain_{block}x{warps}",
                          lambda: one_shot_all_reduce(x, *args, wait_s=wait_s, shape=(block, warps)))
            for warps in (16, 8, 4):
                if warps * per_sm <= 16:
                    timed(f"t{tokens}_norm_w{warps}",
                          lambda: one_shot_all_reduce_norm(x, residual, weight, 1e-6, *args, wait_s=wait_s,
                                                           warps=warps))
            # check: the plain sum against NCCL's on this grid
            y = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
            z = y.clone()
            dist.all_reduce(y)
            one_shot_all_reduce(z, *args, wait_s=wait_s)
            row[f"t{tokens}_plain_equals_nccl"] = bool(torch.equal(y, z))
        torch.cuda.synchronize()
        row["error_flag"] = int(custom.error.item())
        out[str(programs)] = row
        log(f"all-reduce grid {programs} (rank {rank}): {row}")
        dist.barrier(group=control)
        custom.close()
    return out


def _prefetch_probe(custom, sizes_mb=(0, 8, 16, 24, 32, 48), modes=("bulk", "line", "load")) -> dict:
    """A decode step's GEMMs and all-reduces at TP=2 (8B shard shapes, 36 layers, distinct weights; no
    attention), in one CUDA graph, with the next GEMM's weight prefetched into L2 during each all-reduce
    (`prefetch_to_l2`, on a side stream joined after the all-reduce): ms per step by mode and MB."""
    import torch.nn.functional as F
    from l2_prefetch import prefetch_to_l2   # this script's directory is sys.path[0]
    shape, world = QWEN3_8B, 2
    hidden, inter, layers = shape["hidden_size"], shape["intermediate_size"] // world, shape["num_hidden_layers"]
    heads, kv_heads = shape["num_attention_heads"] // world, shape["num_key_value_heads"] // world
    q_out, attn = (heads + 2 * kv_heads) * shape["head_dim"], heads * shape["head_dim"]   # one rank's shard
    gen = torch.Generator(device="cuda").manual_seed(3)
    w = [{"qkv": torch.randn(q_out, hidden, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02,
          "o": torch.randn(hidden, attn, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02,
          "gate_up": torch.randn(2 * inter, hidden, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02,
          "down": torch.randn(hidden, inter, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02}
         for _ in range(layers)]
    norm_w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    out: dict = {}
    for tokens in (64, 256):
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        att = torch.randn(tokens, attn, device="cuda", dtype=torch.bfloat16)
        resid = torch.zeros(tokens, hidden, device="cuda", dtype=torch.bfloat16)

        def all_reduce(y, nxt, mb, mode):
            if mb:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    prefetch_to_l2(nxt, mb << 20, mode)
            _, normed = custom.add_norm(y, resid, norm_w, 1e-6)
            if mb:
                torch.cuda.current_stream().wait_stream(side)
            return normed

        for mode in modes:
            for mb in sizes_mb:
                if mb == 0 and mode != modes[0]:
                    continue

                def step():
                    h = x
                    for i, lw in enumerate(w):
                        F.linear(h, lw["qkv"])
                        h = all_reduce(F.linear(att, lw["o"]), lw["gate_up"], mb, mode)
                        gu = F.linear(h, lw["gate_up"])
                        act = F.silu(gu[:, :inter]) * gu[:, inter:]
                        h = all_reduce(F.linear(act, lw["down"]), w[(i + 1) % layers]["qkv"], mb, mode)
                try:
                    graph = _graph_of(step, 1)
                    ms = [_time_cuda(graph.replay, 10) for _ in range(3)]
                    del graph
                    out[f"t{tokens}_{mode}_{mb}MB"] = round(statistics.median(ms), 4)
                except Exception as exc:   # a mode that does not compile here is recorded, not fatal
                    out[f"t{tokens}_{mode}_{mb}MB"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                log(f"prefetch probe t{tokens} {mode} {mb} MB: {out[f't{tokens}_{mode}_{mb}MB']}")
    torch.cuda.synchronize()
    out["error_flag"] = int(custom.error.item())
    return out


def _allreduce_rank(rank: int, init_file: str, result_file: str) -> None:
    import pickle
    import numpy as np
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from reference.distributed.custom_all_reduce import OneShotAllReduce, usable
    from reference.distributed.step_channel import HeldTables, SentTables, StepChannel, StepSequence, decode, encode
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    control = dist.new_group(backend="gloo")
    hidden, per_graph = QWEN3_8B["hidden_size"], 2 * QWEN3_8B["num_hidden_layers"]
    custom = OneShotAllReduce(rank, 2, torch.bfloat16, 256 * hidden * 2, control) if usable(2, torch.bfloat16) else None
    rows: dict = {}
    for tokens in (1, 16, 64, 256, 2048, 8192):   # 8192: a prefill step of max_num_batched_tokens
        row: dict = {"bytes": tokens * hidden * 2}
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
        row["nccl_eager_us"] = _time_cuda(lambda: dist.all_reduce(x), 100) * 1e3
        graph = _graph_of(lambda: dist.all_reduce(x), per_graph)
        row["nccl_graph_us"] = _time_cuda(graph.replay, 10) * 1e3 / per_graph
        del graph
        if custom is not None and custom.fits(x):
            row["custom_eager_us"] = _time_cuda(lambda: custom(x), 100) * 1e3
            graph = _graph_of(lambda: custom(x), per_graph)
            row["custom_graph_us"] = _time_cuda(graph.replay, 10) * 1e3 / per_graph
            del graph
            y = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
            z = y.clone()
            dist.all_reduce(y)
            custom(z)
            torch.cuda.synchronize()
            row["custom_equals_nccl"] = bool(torch.equal(y, z))
            row["custom_max_abs_diff"] = float((y.float() - z.float()).abs().max())
            # with the residual add fused in: residual + all_reduce(x), bit for bit
            y = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
            r1 = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
            r2, z = r1.clone(), y.clone()
            dist.all_reduce(y)
            custom(z, residual=r2)
            torch.cuda.synchronize()
            row["custom_residual_equals_nccl_plus_add"] = bool(torch.equal(r1 + y, r2))
        if custom is not None and tokens in (64, 256) and custom.fits(x):
            row["custom_graph_us_by_block_warps"] = _launch_shape_sweep(custom, x, per_graph)
            row["custom_norm_graph_us"], row["custom_norm_vs_two_steps"] = _fused_norm_probe(custom, tokens, hidden,
                                                                                             per_graph)
        rows[tokens] = row
    out = {"by_tokens": rows, "custom_available": custom is not None,
           "custom_error_flag": int(custom.error.item()) if custom is not None else None}
    if custom is not None and os.environ.get("GPU_TP_AR_PROBES", "1") == "1":
        out["grid_sweep"] = _grid_sweep(rank, control, hidden, per_graph)
        out["prefetch"] = _prefetch_probe(custom)
    # The link: a plain copy GPU 0 -> GPU 1 (peer to peer), and NCCL send/recv, 256 MiB.
    big = torch.empty(128 * 2**20, dtype=torch.bfloat16, device="cuda")
    if rank == 0:
        other = torch.empty_like(big, device="cuda:1")
        out["p2p_copy_GB_s"] = big.numel() * 2 / (_time_cuda(lambda: other.copy_(big), 10) / 1e3) / 1e9
        del other
    dist.barrier()
    send_ms = _time_cuda(lambda: dist.send(big, 1) if rank == 0 else dist.recv(big, 0), 10)
    out["nccl_send_recv_GB_s"] = big.numel() * 2 / (send_ms / 1e3) / 1e9
    del big
    # Step inputs: one decode step of 256 sequences with 33-block tables, as pickles over gloo
    # (the old broadcast_object_list) and through the shared-memory channel; per step, pipelined.
    seqs = [StepSequence(i, [1000 + i], 500, 499, 1, list(range(i * 40, i * 40 + 33))) for i in range(256)]
    steps = 200
    dist.barrier(group=control)
    t0 = time.perf_counter()
    for _ in range(steps):
        message = [("run", seqs, False)] if rank == 0 else [None]
        dist.broadcast_object_list(message, src=0, group=control)
    dist.barrier(group=control)
    out["pickle_gloo_us_per_step"] = (time.perf_counter() - t0) / steps * 1e6
    holder: list = [None]
    if rank == 0:
        channel = StepChannel(mp.get_context("spawn"), 1, 4 * 2**20)
        holder[0] = channel.name
    dist.broadcast_object_list(holder, src=0, group=control)
    if rank == 1:
        from multiprocessing import shared_memory
        channel = StepChannel.__new__(StepChannel)
        channel.shm, channel.slot_size, channel.next_slot = shared_memory.SharedMemory(name=holder[0]), 4 * 2**20, 0
    # Semaphores cannot cross this group: the probe passes the slots in lock step over gloo instead
    # and times only the encode + copy-in (rank 0) and copy-out + decode (rank 1) of each message.
    # Decode steps in a row: the block tables go whole in the first and not again (nothing new to send).
    t_send = t_receive = 0.0
    sent, held = SentTables(), HeldTables()
    for i in range(steps):
        if rank == 0:
            e0 = time.perf_counter()
            arrays = encode(seqs, False, sent)
            base = channel.next_slot * channel.slot_size
            header = pickle.dumps(("run", (False, False), [(k, len(a)) for k, a in arrays.items()]))
            channel.shm.buf[base:base + len(header)] = header
            offset = base + 4096
            for a in arrays.values():
                np.frombuffer(channel.shm.buf, dtype=np.int64, count=len(a), offset=offset)[:] = a
                offset += 8 * len(a)
            t_send += time.perf_counter() - e0
            shapes = [(k, len(a)) for k, a in arrays.items()]
        dist.barrier(group=control)
        if rank == 1:
            e0 = time.perf_counter()
            base = channel.next_slot * channel.slot_size
            method, flags, shapes = pickle.loads(bytes(channel.shm.buf[base:base + 4096]))
            got, offset = {}, base + 4096
            for name, n in shapes:
                got[name] = np.frombuffer(channel.shm.buf, dtype=np.int64, count=n, offset=offset).copy()
                offset += 8 * n
            decoded = decode(got, False, held)
            t_receive += time.perf_counter() - e0
            assert len(decoded) == 256 and decoded[5].block_table == seqs[5].block_table
        dist.barrier(group=control)
    times = [None, None]
    dist.all_gather_object(times, (t_send / steps * 1e6, t_receive / steps * 1e6), group=control)
    out["shm_rank0_encode_copy_us"], out["shm_worker_copy_decode_us"] = times[0][0], times[1][1]
    dist.barrier(group=control)
    channel.shm.close()
    if rank == 0:
        try:
            channel.shm.unlink()
        except FileNotFoundError:
            pass
        Path(result_file).write_text(json.dumps(out))
    if custom is not None:
        torch.cuda.synchronize()
        custom.close()
    dist.destroy_process_group()


def _two_ranks(rank_main) -> dict:
    """Run rank_main(rank, init_file, result_file) in two spawned processes; rank 0's JSON result."""
    import torch.multiprocessing as mp
    tmp = tempfile.mkdtemp()
    result = os.path.join(tmp, "result.json")
    mp.start_processes(rank_main, args=(os.path.join(tmp, "init"), result), nprocs=2, start_method="spawn")
    return json.loads(Path(result).read_text())


@part("allreduce", 40)
def allreduce() -> dict:
    out = _two_ranks(_allreduce_rank)
    ok = out["custom_available"] and not out["custom_error_flag"] and all(
        r.get("custom_equals_nccl", True) and r.get("custom_residual_equals_nccl_plus_add", True)
        for r in out["by_tokens"].values())
    out["custom_ok"] = bool(ok)
    if not ok:   # the rest of the run measures what works
        os.environ["INFERLAB_TP_ALL_REDUCE"] = "nccl"
    out["note"] = ("per decode step of the 8B shape: 2 all-reduces per layer x 36 layers = 72 (+1 in the embedding); "
                   "*_graph_us: 72 calls captured in one CUDA graph, per call")
    return out


# -- gpu_tests -----------------------------------------------------------------------------------
@part("gpu_tests", 120)
def gpu_tests() -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", "cuda",
           "tests/distributed/test_custom_all_reduce.py", "tests/distributed/test_tensor_parallel.py",
           "tests/distributed/test_disaggregation.py", "-k", "gpu or two_gpus or one_gpu"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return {"command": " ".join(cmd[1:]), "returncode": proc.returncode, "seconds": round(time.monotonic() - t0, 1),
            "tail": (proc.stdout + proc.stderr)[-2500:]}


# -- engines ------------------------------------------------------------------------------------
def prompts_for(vocab: int, batch: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, PROMPT_LEN), generator=gen).tolist()


def build(model: str, tp: int, **overrides):
    from reference import LLM, SamplingParams
    t0 = time.monotonic()
    llm = LLM(model, tensor_parallel_size=tp, **{**ENGINE, **overrides})
    llm.generate([[1, 2, 3, 4]] * 4, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    return llm, time.monotonic() - t0


def close(llm) -> None:
    if hasattr(llm.model_runner, "close"):
        llm.model_runner.close()
    del llm
    free_gpu()


BANDS = (("all_reduce", ("one_shot_all_reduce", "AllReduce")), ("all_gather", ("AllGather",)),
         ("broadcast", ("Broadcast",)), ("attention", ("paged", "attention", "decode_kernel", "flash")),
         ("gemm", ("gemm", "nvjet", "sm90", "cutlass", "cublas", "Kernel2")))


PROFILE_ACTIVITIES = [torch.profiler.ProfilerActivity.CUDA]


def band_of(name: str) -> str:
    for band, keys in BANDS:
        if any(k in name for k in keys):
            return band
    return "other"


class _HostClock:
    """Rank 0's host, without a profiler: how long each decode graph's launch (`replay()`) takes, and how long
    the engine waits for the GPU (reading a step's sampled tokens). A host that never waits sets the pace."""

    def __init__(self, runner):
        from reference.engine import model_runner
        self.runner, self.module = runner, model_runner
        self.launch = {"n": 0, "s": 0.0}
        self.wait = {"n": 0, "s": 0.0}
        self.events: list[tuple] = []       # (before, after) each decode graph's replay, on the GPU's clock
        self.graphs = dict(runner.graphs)
        for bucket, graph in self.graphs.items():
            runner.graphs[bucket] = self._timed_graph(graph)
        self.tokens = getattr(getattr(model_runner, "InFlightStep", None), "tokens", None)   # (not in older engines)
        clock, plain = self.wait, self.tokens

        def timed_tokens(step):
            t = time.perf_counter()
            try:
                return plain(step)
            finally:
                clock["s"] += time.perf_counter() - t
                clock["n"] += 1
        if plain is not None:
            model_runner.InFlightStep.tokens = timed_tokens

    def _timed_graph(self, graph):
        clock, events = self.launch, self.events

        class Timed:
            def replay(self):
                before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                before.record()
                t = time.perf_counter()
                graph.replay()
                clock["s"] += time.perf_counter() - t
                clock["n"] += 1
                after.record()
                events.append((before, after))
        return Timed()

    def stop(self) -> None:
        self.runner.graphs.update(self.graphs)
        if self.tokens is not None:
            self.module.InFlightStep.tokens = self.tokens

    def per_step(self) -> dict:
        """Host means; and on the GPU's own clock (events, no profiler), the median decode graph and the median
        time from one graph's start to the next: what a step spends outside its graph (input copies, LM head,
        sampling, and any wait for the host) is the difference."""
        mean = lambda c: round(c["s"] / c["n"] * 1e6, 1) if c["n"] else None
        out = {"graph_launch_host_us": mean(self.launch), "host_wait_for_gpu_us_per_step": mean(self.wait)}
        if len(self.events) > 4:
            torch.cuda.synchronize()
            graph = [b.elapsed_time(a) for b, a in self.events]
            period = [b0.elapsed_time(b1) for (b0, _), (b1, _) in zip(self.events, self.events[1:])]
            typical = statistics.median(period)
            out["graph_gpu_ms_median"] = round(statistics.median(graph), 3)
            out["graph_start_to_start_ms_median"] = round(typical, 3)
            # the slow ones: (graph index, graph ms, ms from its end to the next start). A long graph waited
            # inside (for the other rank, at an all-reduce); a long gap waited for this host to launch.
            out["slow_graphs"] = [(i, round(graph[i], 2), round(a.elapsed_time(b1), 2))
                                  for i, ((_, a), (b1, _)) in enumerate(zip(self.events, self.events[1:]))
                                  if period[i] > 1.5 * typical][:30]
        return out


def timed_run(llm, prompts: list[list[int]], output_len: int, profile_steps: int = 0, trace: Path | None = None,
              profile_prefill: bool = False) -> dict:
    """Every request at once; output tok/s over the whole run, and the decode step period at full batch.

    `profile_prefill`: profile the first step (a prefill of the whole batch, or its first chunk) instead of
    decode steps; the profiler waits for that step's GPU work before it stops."""
    from reference import SamplingParams
    from reference.engine.collector import full_collections_deferred
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    batch = len(prompts)
    sent = {"n": 0, "s": 0.0}
    runner = llm.model_runner
    if hasattr(runner, "_send"):
        plain = runner._send

        def timed_send(*args, **kwargs):
            t = time.perf_counter()
            plain(*args, **kwargs)
            sent["s"] += time.perf_counter() - t
            sent["n"] += 1
        runner._send = timed_send
    host = _HostClock(runner)
    pauses = Pauses()
    gc.collect()
    gc.freeze()
    gc.callbacks.append(pauses)
    torch.cuda.synchronize()
    periods, ends, prof, profiled = [], [], None, 0
    with full_collections_deferred():
        start = last = time.perf_counter()
        for p in prompts:
            llm.add_request(p, params)
        if profile_prefill:
            prof = torch.profiler.profile(activities=PROFILE_ACTIVITIES)
            prof.__enter__()
            profile_steps = 1
        while not llm.is_finished():
            full = llm.num_running == batch and llm.num_waiting == 0
            if profile_steps and prof is None and full and len(periods) > 8 + batch // 64:
                prof = torch.profiler.profile(activities=PROFILE_ACTIVITIES if trace is None else
                                              [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
                prof.__enter__()
            llm.step()
            now = time.perf_counter()
            periods.append((now - last, full))
            ends.append(time.monotonic())
            last = now
            if prof is not None and profiled < profile_steps:
                profiled += 1
                if profiled == profile_steps:
                    torch.cuda.synchronize()
                    prof.__exit__(None, None, None)
        torch.cuda.synchronize()
        end = time.perf_counter()
        if prof is not None and profiled < profile_steps:    # the run ended first: keep what was seen
            prof.__exit__(None, None, None)
            profile_steps = max(1, profiled)
    gc.callbacks.remove(pauses)
    gc.unfreeze()
    if hasattr(runner, "_send"):
        del runner._send
    host.stop()
    tokens = sum(len(s.output_token_ids) for s in llm.finished.values())
    llm.finished.clear()
    decode = [p for p, full in periods if full]
    decode_median = statistics.median(decode) if decode else None
    first_full = next((i for i, (_, full) in enumerate(periods) if full), len(periods))
    out = {"batch": batch, "output_tokens": tokens, "elapsed_s": end - start, "output_tok_per_s": tokens / (end - start),
           "steps": len(periods), "decode_step_ms_median": decode_median * 1e3 if decode else None,
           # where the run's time goes, by the host's clock: the steps before the batch is full (prefills; under
           # async scheduling a step's period ends when it has launched the next one), full steps, the rest
           "before_full_ms": [round(p * 1e3, 2) for p, _ in periods[:first_full]],
           "full_steps_s": round(sum(decode), 4),
           "after_full_s": round(sum(p for p, full in periods[first_full:] if not full), 4),
           "end_wait_ms": round((end - last) * 1e3, 2),
           # full steps over 1.5 x the median: (step index, ms, monotonic time at its end), the first 20
           # (a stall: a collection, a late worker; tp_worker_trace.py logs the worker's on the same clock)
           "slow_full_steps": [(i, round(p * 1e3, 2), round(ends[i], 4)) for i, (p, full) in enumerate(periods)
                               if full and p > 1.5 * decode_median][:20],
           "send_us_per_step": sent["s"] / sent["n"] * 1e6 if sent["n"] else None, **host.per_step(),
           "rank0_gc": pauses.summary(), "rank0_gc_pauses_over_2ms": pauses.long}
    if prof is not None and trace is not None:
        prof.export_chrome_trace(str(trace))
        out["trace"] = trace.name
    elif prof is not None:
        bands: dict[str, float] = {}
        kernels = []
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) \
                if PROFILE_ACTIVITIES == [torch.profiler.ProfilerActivity.CUDA] else e.self_cpu_time_total
            if t:
                bands[band_of(e.key)] = bands.get(band_of(e.key), 0.0) + t / 1e3 / profile_steps
                kernels.append((round(t / 1e3 / profile_steps, 4), e.count // profile_steps, e.key[:90]))
        out["gpu_ms_per_step_by_band"] = {k: round(v, 3) for k, v in sorted(bands.items(), key=lambda kv: -kv[1])}
        out["gpu_idle"] = idle_of(prof, profile_steps)
        out["top_kernels_ms_calls_per_step"] = sorted(kernels, reverse=True)[:25]
        out["profiled_steps"] = profile_steps
    return out


def idle_of(prof, steps: int) -> dict:
    """Where this GPU waits: time with no kernel or copy running (over the profiled span), per step, and
    which kernel each wait ended with (what the GPU was waiting to be given: a late launch, a collective's peer)."""
    try:
        spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    except Exception as err:      # the profiler's event API moves between torch versions
        return {"error": repr(err)}
    if not spans:
        return {}
    idle, before, busy_until = 0.0, {}, spans[0][1]
    for start, end, name in spans[1:]:
        if start > busy_until:
            idle += start - busy_until
            before[name[:60]] = before.get(name[:60], 0.0) + start - busy_until
        busy_until = max(busy_until, end)
    return {"idle_ms_per_step": round(idle / 1e3 / steps, 3),
            "span_ms_per_step": round((busy_until - spans[0][0]) / 1e3 / steps, 3),
            "idle_us_per_step_before": {k: round(v / steps, 1) for k, v in
                                        sorted(before.items(), key=lambda kv: -kv[1])[:10]}}


def all_reduce_kind() -> str:
    from reference import parallel_state
    fast = parallel_state._STATE.fast_all_reduce
    return "one-shot (CUDA IPC)" if fast is not None else "nccl"


def custom_error() -> int | None:
    from reference import parallel_state
    fast = parallel_state._STATE.fast_all_reduce
    return int(fast.error.item()) if fast is not None else None


def bench_engine(model: str, vocab: int, tp: int, reps: int, sync_reps: int = int(os.environ.get("GPU_TP_SYNC_REPS", 1)),
                 profile: bool = True,
                 batches=BATCHES, output_len: int = OUTPUT_LEN, **overrides) -> dict:
    llm, built = build(model, tp, **overrides)
    out = {"build_s": round(built, 1), "all_reduce": all_reduce_kind() if tp > 1 else None,
           "cuda_graphs": bool(llm.model_runner.graphs), "runs": []}
    try:
        for batch in batches:    # untimed: a batch's first prefill meets new shapes (kernel loads, compiles)
            timed_run(llm, prompts_for(vocab, batch, seed=5 + batch), 16)
        for rep in range(reps):
            for batch in batches:
                r = timed_run(llm, prompts_for(vocab, batch, seed=1000 * rep + batch), output_len)
                out["runs"].append({"rep": rep, "scheduling": "async" if llm.config.async_scheduling else "sync", **r})
                log(f"TP={tp} rep {rep} batch {batch}: {r['output_tok_per_s']:,.0f} tok/s, "
                    f"step {r['decode_step_ms_median']:.2f} ms")
        if sync_reps and llm.config.async_scheduling:
            llm.config.async_scheduling = False
            for batch in batches:
                r = timed_run(llm, prompts_for(vocab, batch, seed=77 + batch), output_len)
                out["runs"].append({"rep": 0, "scheduling": "sync", **r})
                log(f"TP={tp} sync batch {batch}: {r['output_tok_per_s']:,.0f} tok/s")
            llm.config.async_scheduling = True
        if profile:
            for batch in batches:
                r = timed_run(llm, prompts_for(vocab, batch, seed=99 + batch), min(output_len, 64), profile_steps=6)
                out[f"profile_batch{batch}"] = {k: r.get(k) for k in ("gpu_ms_per_step_by_band", "decode_step_ms_median",
                                                                       "gpu_idle", "top_kernels_ms_calls_per_step")}
                r = timed_run(llm, prompts_for(vocab, batch, seed=97 + batch), 8, profile_prefill=True)
                out[f"profile_prefill_batch{batch}"] = {k: r.get(k) for k in (
                    "gpu_ms_per_step_by_band", "gpu_idle", "top_kernels_ms_calls_per_step", "before_full_ms")}
                if TRACE:
                    timed_run(llm, prompts_for(vocab, batch, seed=98 + batch), min(output_len, 64), profile_steps=4,
                              trace=OUT / f"trace_tp{tp}_b{batch}.json")
        out["custom_error_flag"] = custom_error() if tp > 1 else None
    finally:
        pids = [p.pid for p in getattr(llm.model_runner, "workers", [])]
        close(llm)
    if pids:
        out["worker_trace"] = tp_worker_trace.read(OUT, pids)
    return out


def summarize(results: dict, names: tuple[str, str]) -> dict:
    """Per batch: median tok/s of the async runs of each engine, and the ratios run by run.

    Marked invalid when an engine's one-shot all-reduce gave up a wait: from then on its calls no longer wait
    for the peer, so its steps skip the synchronization they measure (the seventh stop's data-as-flag kernel
    gave up during its build, and its ratios looked better than any before).
    """
    base, other = results[names[0]], results[names[1]]
    out = {}
    gave_up = [name for name in names if results[name].get("custom_error_flag")]
    if gave_up:
        out["INVALID"] = (f"{', '.join(gave_up)}: a one-shot all-reduce wait gave up (error flag set); later calls "
                          "did not wait for the peer, so these figures do not measure a synchronized all-reduce")
    for batch in BATCHES:
        a = [r["output_tok_per_s"] for r in base["runs"] if r["batch"] == batch and r["scheduling"] == "async"]
        b = [r["output_tok_per_s"] for r in other["runs"] if r["batch"] == batch and r["scheduling"] == "async"]
        if a and b:
            out[f"batch{batch}"] = {"ratio_per_run": [round(y / x, 3) for x, y in zip(a, b)],
                                    "ratio_of_medians": round(statistics.median(b) / statistics.median(a), 3)}
    return out


def model_8b() -> str:
    return str(make_random_model(random_model_dir("qwen3-8b", "bfloat16"), shape=QWEN3_8B, dtype=torch.bfloat16,
                                 device="cuda"))


def model_0_6b() -> str:
    return str(make_random_model(random_model_dir("qwen3-0.6b", "bfloat16"), shape=QWEN3_0_6B,
                                 dtype=torch.bfloat16))


@part("tp_bench", 150)
def tp_bench() -> dict:
    t0 = time.monotonic()
    model = model_8b()
    out = {"model": "Qwen3-8B shape, random bf16",
           "workload": f"decode batch B: B requests of {PROMPT_LEN} prompt tokens, {OUTPUT_LEN} output tokens each, "
                       "all submitted at once; output tok/s over the whole run (prefill included)",
           "model_build_s": round(time.monotonic() - t0, 1)}
    RESULTS["tp_bench"] = out
    log(f"tp_bench: 8B model ready in {time.monotonic() - t0:.0f} s")
    out["tp1"] = bench_engine(model, QWEN3_8B["vocab_size"], 1, REPS)
    save()
    out["tp2"] = bench_engine(model, QWEN3_8B["vocab_size"], 2, REPS)
    out["tp2_over_tp1"] = summarize(out, ("tp1", "tp2"))
    save()
    if os.environ.get("GPU_TP_NCCL_VARIANT", "0") == "1" and BUDGET_S - (time.monotonic() - START) > 150 \
            and out["tp2"]["all_reduce"] != "nccl":
        saved = os.environ.get("INFERLAB_TP_ALL_REDUCE")
        os.environ["INFERLAB_TP_ALL_REDUCE"] = "nccl"
        try:
            out["tp2_nccl"] = bench_engine(model, QWEN3_8B["vocab_size"], 2, 1)
        finally:
            if saved is None:
                os.environ.pop("INFERLAB_TP_ALL_REDUCE", None)
            else:
                os.environ["INFERLAB_TP_ALL_REDUCE"] = saved
        out["tp2_nccl_over_tp1"] = summarize(out, ("tp1", "tp2_nccl"))
    return out


@part("small", 90)
def small() -> dict:
    model = model_0_6b()
    vocab = QWEN3_0_6B["vocab_size"]
    out = {"model": "Qwen3-0.6B shape, random bf16"}
    RESULTS["small"] = out
    out["tp1"] = bench_engine(model, vocab, 1, 2, sync_reps=0)
    out["tp2"] = bench_engine(model, vocab, 2, 2, sync_reps=0)
    out["tp2_over_tp1"] = summarize(out, ("tp1", "tp2"))
    save()
    for tp in (1, 2):   # eager: no CUDA graphs, no compiled elementwise ops
        out[f"eager_tp{tp}"] = bench_engine(model, vocab, tp, 1, sync_reps=0, profile=False, batches=(64,),
                                            output_len=128, enforce_eager=True)
    e1, e2 = (out[f"eager_tp{tp}"]["runs"][0]["output_tok_per_s"] for tp in (1, 2))
    out["eager_tp2_over_tp1"] = round(e2 / e1, 3)
    # bf16 tokens: TP=2 (graphs, one-shot all-reduce) against TP=1
    from reference import LLM, SamplingParams
    prompts = [r.prompt[:200] for r in make_workload("quick", vocab, seed=1)[:16]]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    tokens = {}
    for tp in (1, 2):
        llm = LLM(model, tensor_parallel_size=tp, **{**ENGINE, "max_num_seqs": 16})
        tokens[tp] = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
        close(llm)
    first = sum(a[0] == b[0] for a, b in zip(tokens[1], tokens[2])) / len(prompts)
    out["bf16_tokens"] = {"first_token_agreement": first, "within_tolerance": first >= 0.9,
                          "prompts_equal": sum(a == b for a, b in zip(tokens[1], tokens[2])), "prompts": len(prompts)}
    return out


# -- pd -----------------------------------------------------------------------------------------
def _summary(ttfts, tpots, tokens, elapsed) -> dict:
    pct = lambda xs, q: sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else None
    return {"ttft_p50_ms": pct(ttfts, 0.5) * 1e3, "ttft_p99_ms": pct(ttfts, 0.99) * 1e3,
            "tpot_p50_ms": pct(tpots, 0.5) * 1e3 if tpots else None,
            "tpot_p99_ms": pct(tpots, 0.99) * 1e3 if tpots else None,
            "output_tok_per_s": tokens / elapsed, "elapsed_s": elapsed}


@part("pd", 90)
def pd() -> dict:
    from reference import LLM, SamplingParams
    from reference.distributed.disaggregation import DisaggregatedLLM
    from reference.metrics import request_metrics
    model = model_8b()
    requests = make_workload("quick", QWEN3_8B["vocab_size"], seed=0)
    params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in requests]
    prompts = [r.prompt for r in requests]
    config = dict(device="cuda", dtype="bfloat16", max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=1024)
    out = {"workload": "quick (64 requests submitted at once)", "model": "Qwen3-8B shape, random bf16"}
    llm = LLM(model, **config)
    llm.generate(prompts[:4], params[:4], use_tqdm=False)    # warm-up
    first = len(llm.log.events)
    t0 = time.perf_counter()
    colocated = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    m = list(request_metrics(llm.log.events[first:]).values())
    out["colocated"] = _summary([x.ttft for x in m], [x.tpot for x in m if x.tpot is not None],
                                sum(len(o["token_ids"]) for o in colocated), elapsed)
    del llm
    free_gpu()
    pd_llm = DisaggregatedLLM(model, **config)
    try:
        pd_llm.generate(prompts[:4], params[:4])                  # warm-up
        t0 = time.perf_counter()
        results = pd_llm.generate(prompts, params)
        elapsed = time.perf_counter() - t0
    finally:
        pd_llm.close()
    ttfts = [r["first_token_time"] - r["arrival_time"] for r in results]
    tpots = [(r["finished_time"] - r["first_token_time"]) / (len(r["token_ids"]) - 1)
             for r in results if len(r["token_ids"]) > 1]
    out["disaggregated"] = _summary(ttfts, tpots, sum(len(r["token_ids"]) for r in results), elapsed)
    out["tokens_equal_colocated"] = [r["token_ids"] for r in results] == [o["token_ids"] for o in colocated]
    transfers = sorted((r["kv_bytes"], r["kv_transfer_s"]) for r in results if r["kv_bytes"])
    out["kv_transfer"] = {
        "requests": len(transfers), "total_bytes": sum(b for b, _ in transfers),
        "posted_to_seen_complete_s_total": sum(s for _, s in transfers),
        "median": {"bytes": transfers[len(transfers) // 2][0], "ms": transfers[len(transfers) // 2][1] * 1e3},
        "note": "seconds: from the receive's post to the poll that saw it complete (an upper bound); "
                "the link itself: allreduce.nccl_send_recv_GB_s and p2p_copy_GB_s"}
    return out


def _kvlink_rank(rank: int, init_file: str, result_file: str) -> None:
    """Both ranks: the engine's own handoff functions on a KV cache of the 8B shape, timed by CUDA events."""
    import torch.distributed as dist
    from reference.distributed import kv_transfer
    from reference.distributed.kv_transfer import post_receive, post_send, store
    if os.environ.get("GPU_TP_KV_WORDS") == "0":     # the handoff as before: blocks copied in the cache's dtype
        kv_transfer.as_words = lambda cache: cache
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))   # a mismatch fails, fast
    layers, kv_heads, head_dim, block = QWEN3_8B["num_hidden_layers"], QWEN3_8B["num_key_value_heads"], 128, 16
    kv = torch.randn(2, layers, 1024, block, kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    cuda = torch.device("cuda", rank)

    def timed(fn, reps: int = 5) -> float:
        """Median milliseconds of fn on this GPU's clock, both ranks starting together."""
        times = []
        for _ in range(reps + 1):
            torch.cuda.synchronize()
            dist.barrier(group=control)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times[1:])[reps // 2]

    rows = {}
    for blocks in (10, 64, 256):      # 10 blocks: a 160-token prompt, the `pd` part's median request
        ids = list(range(3, 3 + 2 * blocks, 2))     # every other block: a gather, as a real table needs
        nbytes = 2 * layers * blocks * block * kv_heads * head_dim * 2
        row: dict = {"blocks": blocks, "bytes": nbytes}
        if rank == 0:
            handoff = lambda: post_send(None, kv, ids, 1, cuda).work.wait()
        else:
            def handoff():
                t = post_receive(None, kv, ids, 0, cuda)
                store(t, kv, ids)
        row["handoff_ms"] = timed(handoff)                   # gather + send (rank 0) / receive + store (rank 1)
        payload = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        row["send_recv_ms"] = timed(lambda: dist.send(payload, 1) if rank == 0 else dist.recv(payload, 0))
        # Both ranks time two more things each, so that every `timed` (and its barriers) has its partner.
        index = torch.tensor(ids, dtype=torch.int64, device="cuda")
        if rank == 0:
            row["gather_ms"] = timed(lambda: kv_transfer.as_words(kv)[:, :, index].contiguous())
            other = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda:1")
            row["p2p_copy_ms"] = timed(lambda: other.copy_(payload))
            del other
        else:
            words = kv_transfer.as_words(kv)
            staged = torch.empty_like(words[:, :, :blocks])
            row["scatter_ms"] = timed(lambda: words.__setitem__((slice(None), slice(None), index), staged))
            local = torch.empty_like(payload)
            row["local_copy_ms"] = timed(lambda: local.copy_(payload))
            del local
        for key in [k for k in row if k.endswith("_ms")]:
            row[key.replace("_ms", "_GB_s")] = round(nbytes / (row[key] / 1e3) / 1e9, 1)
        rows[blocks] = row
    both: list = [None, None]
    dist.all_gather_object(both, rows, group=control)
    if rank == 0:
        Path(result_file).write_text(json.dumps({"rank0": both[0], "rank1": both[1]}))
    dist.destroy_process_group()


@part("kvlink", 30)
def kvlink() -> dict:
    """The P/D handoff's bandwidth against the link's: the engine's post_send / post_receive + store."""
    out = _two_ranks(_kvlink_rank)
    out["note"] = ("handoff: rank 0 gathers the blocks and sends, rank 1 receives and scatters them into its "
                   "blocks, timed on each GPU from a common start; send_recv: the same bytes contiguous, NCCL; "
                   "p2p_copy: a peer-to-peer copy GPU 0 -> GPU 1 (the link's figure); local_copy: a copy within GPU 1")
    return out


# -- serve ---------------------------------------------------------------------------------------
def _serve_curve(model: str, tp: int, rates: list[str], num_prompts: int) -> dict:
    import socket
    import httpx
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "inferlab.cli", "serve", model, "--port", str(port), "--device", "cuda",
           "--dtype", "bfloat16", "--max-num-seqs", "256", "--max-model-len", "1024", "--async-scheduling",
           "--tensor-parallel-size", str(tp)]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0 = time.monotonic()
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() - t0 > 180:
                raise RuntimeError(f"server did not start: {server.stdout.read()[-2000:]}")
            time.sleep(0.5)
        started = time.monotonic() - t0
        report = Path(tempfile.mkdtemp()) / "serve.json"
        bench = [sys.executable, "-m", "inferlab.cli", "bench", "serve", "--url", f"http://127.0.0.1:{port}",
                 "--num-prompts", str(num_prompts), "--random-input-len", "256", "--random-output-len", "128",
                 "--request-rate", *rates, "--out", str(report)]
        proc = subprocess.run(bench, cwd=ROOT, capture_output=True, text=True, timeout=240)
        curve = json.loads(report.read_text()) if report.exists() else {"error": proc.stdout[-2000:] + proc.stderr[-2000:]}
        return {"server_start_s": round(started, 1), "command": " ".join(cmd[2:]), "bench": " ".join(bench[2:]),
                "table": proc.stdout[-2500:], "report": curve}
    finally:
        import signal
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        free_gpu()


@part("serve", 100)
def serve() -> dict:
    small_shape = os.environ.get("GPU_TP_SERVE_SHAPE", "8b") == "0.6b"
    model = model_0_6b() if small_shape else model_8b()
    rates = os.environ.get("GPU_TP_SERVE_RATES", "8 32 inf").split()
    out = {"model": f"Qwen3-{'0.6B' if small_shape else '8B'} shape, random bf16", "rates": rates}
    RESULTS["serve"] = out
    for tp in (1, 2):
        out[f"tp{tp}"] = _serve_curve(model, tp, rates, num_prompts=int(os.environ.get("GPU_TP_SERVE_PROMPTS", 128)))
        save()
    return out


# -- before --------------------------------------------------------------------------------------
@part("before", 100)
def before() -> dict:
    """The engine before issue 35, TP=2 (sync scheduling: it had no other), graphs, in a child process
    that is killed once it has printed its figures (that engine could hang at exit)."""
    old = os.environ.get("GPU_TP_OLD")
    if not old:
        return {"skipped": "GPU_TP_OLD not set"}
    model = model_8b()
    shutil_copy = Path(old) / "scripts" / "gpu_tp.py"
    shutil_copy.parent.mkdir(parents=True, exist_ok=True)
    shutil_copy.write_text(Path(__file__).read_text())
    cmd = [sys.executable, str(shutil_copy), "--child-bench", model, "2", "sync"]
    proc = subprocess.Popen(cmd, cwd=old, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, result = [], None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("CHILD_RESULT "):
            result = json.loads(line[len("CHILD_RESULT "):])
            break
    exit_wait = time.monotonic()
    try:
        proc.wait(30)
        exited = f"exited by itself in {time.monotonic() - exit_wait:.1f} s (code {proc.returncode})"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        exited = "did not exit within 30 s of finishing: killed"
    subprocess.run(["pkill", "-P", str(proc.pid)], check=False)
    return {"result": result, "exit": exited, "log_tail": "".join(lines)[-1500:]}


def child_bench(model: str, tp: int, scheduling: str) -> None:
    """In the old tree: one engine, decode batch 64 and 256, one run each; prints CHILD_RESULT {...}."""
    ENGINE["async_scheduling"] = scheduling == "async"
    llm, built = build(model, tp)
    runs = [timed_run(llm, prompts_for(QWEN3_8B["vocab_size"], b, seed=b), OUTPUT_LEN) for b in BATCHES]
    print("CHILD_RESULT " + json.dumps({"build_s": built, "runs": runs}), flush=True)
    if hasattr(llm.model_runner, "close"):
        llm.model_runner.close()


# -- table -----------------------------------------------------------------------------------------
def table() -> None:
    print("\n==================== gpu_tp summary ====================")
    for name, r in RESULTS.items():
        if not isinstance(r, dict):
            continue
        if "error" in r or "skipped" in r:
            print(f"{name:10s} {'ERROR' if 'error' in r else 'SKIPPED'}: {str(r.get('error') or r.get('skipped'))[-600:]}")
        if name == "allreduce" and "by_tokens" in r:
            print(f"{name:10s} custom ok {r.get('custom_ok')}; p2p copy {r.get('p2p_copy_GB_s', 0):.0f} GB/s, "
                  f"NCCL send/recv {r.get('nccl_send_recv_GB_s', 0):.0f} GB/s; step inputs: pickles/gloo "
                  f"{r.get('pickle_gloo_us_per_step', 0):.0f} us, shm rank0 {r.get('shm_rank0_encode_copy_us') or 0:.0f} us "
                  f"+ worker {r.get('shm_worker_copy_decode_us') or 0:.0f} us")
            for tokens, row in r["by_tokens"].items():
                print(f"{'':10s} {tokens:>5} tok: NCCL eager {row['nccl_eager_us']:.1f} graph {row['nccl_graph_us']:.1f} us; "
                      f"one-shot eager {row.get('custom_eager_us', float('nan')):.1f} graph "
                      f"{row.get('custom_graph_us', float('nan')):.1f} us")
        elif name == "gpu_tests":
            print(f"{name:10s} rc={r.get('returncode')} {r.get('tail', '').strip().splitlines()[-1:]}")
        elif name in ("tp_bench", "small"):
            for key in ("tp1", "tp2", "tp2_nccl", "eager_tp1", "eager_tp2"):
                e = r.get(key)
                if not e:
                    continue
                for run in e["runs"]:
                    print(f"{name:10s} {key:9s} {run['scheduling']:5s} B={run['batch']:3d} rep {run['rep']}: "
                          f"{run['output_tok_per_s']:8,.0f} tok/s, step {run['decode_step_ms_median'] or 0:.2f} ms, "
                          f"send {run['send_us_per_step'] or 0:.0f} us, graph launch "
                          f"{run.get('graph_launch_host_us') or 0:.0f} us, host waits "
                          f"{run.get('host_wait_for_gpu_us_per_step') or 0:.0f} us a step; GPU: graph "
                          f"{run.get('graph_gpu_ms_median') or 0:.3f} ms, start to start "
                          f"{run.get('graph_start_to_start_ms_median') or 0:.3f} ms; before full "
                          f"{run.get('before_full_ms')} ms, full {run.get('full_steps_s')} s, after "
                          f"{run.get('after_full_s')} s; slow full steps {run.get('slow_full_steps')}; slow graphs "
                          f"{run.get('slow_graphs')}; rank 0 GC {run.get('rank0_gc')}")
                for trace in e.get("worker_trace") or []:
                    print(f"{name:10s} {key:9s} worker: {trace}"[:1500])
                for batch in BATCHES:
                    for kind in ("profile", "profile_prefill"):
                        p = e.get(f"{kind}_batch{batch}")
                        if p:
                            print(f"{name:10s} {key:9s} {kind} B={batch}: {p['gpu_ms_per_step_by_band']} "
                                  f"idle {(p.get('gpu_idle') or {}).get('idle_ms_per_step')}")
                            for ms, calls, kernel in (p.get("top_kernels_ms_calls_per_step") or [])[:8]:
                                print(f"{'':10s}   {ms:7.3f} ms {calls:4d}x {kernel[:70]}")
            for key in ("tp2_over_tp1", "tp2_nccl_over_tp1", "eager_tp2_over_tp1", "bf16_tokens"):
                if key in r:
                    print(f"{name:10s} {key}: {r[key]}")
        elif name == "pd" and "colocated" in r:
            for kind in ("colocated", "disaggregated"):
                e = r[kind]
                print(f"{name:10s} {kind:13s} TTFT p50 {e['ttft_p50_ms']:.1f} ms, TPOT p50 {e['tpot_p50_ms']:.1f} ms, "
                      f"{e['output_tok_per_s']:,.0f} out tok/s")
            print(f"{name:10s} tokens equal {r['tokens_equal_colocated']}; KV {r['kv_transfer']}")
        elif name == "serve":
            for tp in ("tp1", "tp2"):
                if tp in r:
                    print(f"{name:10s} {tp}:\n{r[tp].get('table', r[tp])}")
        elif name == "before" and r.get("result"):
            for run in r["result"]["runs"]:
                print(f"{name:10s} B={run['batch']}: {run['output_tok_per_s']:,.0f} tok/s, step "
                      f"{run['decode_step_ms_median'] or 0:.2f} ms; {r['exit']}")
    print(f"total {time.monotonic() - START:.0f} s; JSON in {OUT / 'gpu_tp.json'}")


PARTS = (env, allreduce, gpu_tests, tp_bench, small, pd, kvlink, serve, before)
DEFAULT_PARTS = "env,allreduce,tp_bench,small"

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child-bench":
        child_bench(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        sys.exit(0)
    OUT.mkdir(parents=True, exist_ok=True)
    import faulthandler
    faulthandler.dump_traceback_later(float(os.environ.get("GPU_TP_DUMP_AFTER_S", 555)))   # where a stuck run stands
    if torch.cuda.device_count() < 2:
        RESULTS["error"] = f"needs 2 GPUs, found {torch.cuda.device_count()}"
    else:
        if os.environ.get("GPU_TP_WORKER_TRACE") == "1":
            tp_worker_trace.install(OUT)       # workers log their slow steps and collections to $OUT
        wanted = os.environ.get("GPU_TP_PARTS", DEFAULT_PARTS).split(",")   # e.g. "tp_bench,pd"
        for run in PARTS:
            if run.__name__ in wanted:
                run()
    save()
    table()
