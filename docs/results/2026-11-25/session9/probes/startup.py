"""One-off probe: engine start-up with and without graphs on bench-256's settings; prefill capture time."""
import gc, time, torch
import sys; sys.path.insert(0, "."); from courseware import bench
from reference import LLM
from reference.engine.prefill_graphs import PrefillGraphs
import reference.engine.model_runner as mr
orig = PrefillGraphs.capture
def cap(self):
    t0 = time.perf_counter(); orig(self)
    print(f"  prefill graphs: {len(self.buckets)} buckets x {len(self.graphs[self.buckets[0]])} pieces captured in {time.perf_counter() - t0:.2f} s", flush=True)
PrefillGraphs.capture = cap
orig_w = mr.ModelRunner._warm_up_logits
def warm(self):
    t0 = time.perf_counter(); orig_w(self); print(f"  logits warm-up {time.perf_counter() - t0:.2f} s", flush=True)
mr.ModelRunner._warm_up_logits = warm
d = str(bench.make_random_model(bench.random_model_dir()))
for eager in (False, True, False):
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    llm = LLM(d, max_model_len=2048, max_num_seqs=256, max_num_batched_tokens=16384, enforce_eager=eager)
    print(f"enforce_eager={eager}: init {time.perf_counter() - t0:.2f} s, {llm.model_runner.num_kvcache_blocks} KV blocks, "
          f"reserved {torch.cuda.memory_reserved() / 2**30:.2f} GiB", flush=True)
    del llm; gc.collect(); torch.cuda.empty_cache()
