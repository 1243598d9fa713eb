"""One-off probe: CPU time of each phase of each prefill launch of a bench-256 async run."""
import collections, os, sys, time
import torch
sys.path.insert(0, ".")
from courseware import bench
import reference.engine.model_runner as mr
from reference.engine.prefill_graphs import PrefillGraphs
from reference.models.qwen3 import Qwen3Attention

cur = None
rows = []

def timed(owner, name, label):
    orig = getattr(owner, name)
    def wrapper(*a, **k):
        if cur is None:
            return orig(*a, **k)
        t = time.perf_counter()
        out = orig(*a, **k)
        cur[label] += (time.perf_counter() - t) * 1e3
        return out
    setattr(owner, name, wrapper)

timed(mr.ModelRunner, "prepare_prefill", "prepare")
timed(mr.ModelRunner, "_prefill_forward", "forward")
timed(Qwen3Attention, "attend", "attend")
timed(torch.cuda.CUDAGraph, "replay", "replay")
timed(mr, "sample_on_device", "sample")
timed(mr.InFlightStep, "start", "start")
timed(mr, "sampling_rows", "rows")
timed(mr.ModelRunner, "_tensor", "tensor")
from reference.models.qwen3 import Qwen3ForCausalLM
timed(Qwen3ForCausalLM, "compute_logits", "logits")
import threading, traceback
samples = []
main_id = threading.get_ident()
def sampler():
    while True:
        time.sleep(0.001)
        if cur is not None:
            frame = sys._current_frames().get(main_id)
            stack = traceback.extract_stack(frame)
            here = [f"{os.path.relpath(f.filename)}:{f.lineno}:{f.name}" for f in stack[-4:]]
            samples.append((len(rows), " <- ".join(reversed(here))))
threading.Thread(target=sampler, daemon=True).start()
orig_launch = mr.ModelRunner.launch_prefill
def launch(self, seqs):
    global cur
    cur = collections.defaultdict(float)
    h0 = torch.cuda.host_memory_stats().get("num_host_alloc", -1)
    d0 = torch.cuda.memory_stats().get("num_device_alloc", -1)
    s0 = torch.cuda.memory_stats().get("num_sync_all_streams", -1)
    t = time.perf_counter()
    out = orig_launch(self, seqs)
    cur["total"] = (time.perf_counter() - t) * 1e3
    cur["host_allocs"] = torch.cuda.host_memory_stats().get("num_host_alloc", -1) - h0
    cur["dev_allocs"] = torch.cuda.memory_stats().get("num_device_alloc", -1) - d0
    cur["syncs"] = torch.cuda.memory_stats().get("num_sync_all_streams", -1) - s0
    cur["tokens"] = sum(s.num_scheduled_tokens for s in seqs)
    rows.append(dict(cur)); cur = None
    return out
mr.ModelRunner.launch_prefill = launch
model = str(bench.make_random_model(bench.random_model_dir()))
requests = bench.make_workload("bench-256", 151936)
result = bench.run_engine(model, requests, device="cuda", dtype="bfloat16", max_num_seqs=256,
                          max_num_batched_tokens=16384, kvcache_block_size=16, async_scheduling=True)
band = next(b["seconds"] for b in result["time_by_batch"] if b["steps"] == "prefill")
print(f"{result['output_tok_per_s']:,.0f} output tok/s, prefill band {band:.3f} s")
keys = ["tokens", "total", "prepare", "forward", "replay", "attend", "tensor", "logits", "rows", "sample", "start", "host_allocs", "dev_allocs", "syncs"]
print(" ".join(f"{k:>9}" for k in keys))
for r in rows:
    print(" ".join(f"{r.get(k, 0):9.1f}" for k in keys))

for i in range(len(rows)):
    c = collections.Counter(where for j, where in samples if j == i)
    print(f"launch {i}: {sum(c.values())} samples")
    for where, n in c.most_common(4):
        print(f"   {n:4d}  {where}")
