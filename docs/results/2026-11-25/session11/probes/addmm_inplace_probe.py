"""addmm_ in place (no copy of the residual) + rms_norm vs linear + add_rms_norm, M=16384 and decode M=256.

Session 11, call 3 (each variant x28 in one CUDA graph, median of 10 rounds of 3 replays, us per call).
Run from the repo root at 90ad640 (it needs add_rms_norm, which 8f743c1 removed); writes $OUT/s11probe2.json.
"""
import json, os, statistics, sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, "scripts")
import prefill_attention_bench as pab
from reference.models.qwen3 import ElementwiseOps, add_rms_norm, rms_norm
ops = ElementwiseOps.fused()
H = 1024
w = torch.randn(H, device="cuda", dtype=torch.bfloat16)
res = {}
for M in (16384, 256):
    for name, K in (("o_proj", 2048), ("down_proj", 3072)):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        W = torch.randn(H, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        r0 = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        r1 = r0.clone()
        def base():
            return ops.add_rms_norm(torch.nn.functional.linear(x, W), r0, w, 1e-6)
        def inplace():
            r1.addmm_(x, W.t())
            return ops.rms_norm(r1, w, 1e-6)
        def mm():
            return torch.nn.functional.linear(x, W)
        def addmm_inplace():
            return r1.addmm_(x, W.t())
        def norm_only():
            return ops.rms_norm(r1, w, 1e-6)
        # bits: one step from the same residual
        hb, rb = base()
        r1.copy_(r0); hi = inplace()
        eager_h, eager_r = add_rms_norm(torch.nn.functional.linear(x, W), r0, w, 1e-6)
        bits = dict(resid_differ=float((rb != r1).float().mean()),
                    h_compiled_vs_inplace=float((hb != hi).float().mean()),
                    h_eager_vs_inplace=float((eager_h != hi).float().mean()),
                    h_eager_vs_compiled=float((eager_h != hb).float().mean()),
                    resid_eager_vs_inplace=float((eager_r != r1).float().mean()))
        t = {k: [] for k in ("base", "inplace", "mm", "addmm_", "rms_norm")}
        fns = (("base", base), ("inplace", inplace), ("mm", mm), ("addmm_", addmm_inplace), ("rms_norm", norm_only))
        graphs = {}
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                for k, f in fns:
                    f()
        torch.cuda.current_stream().wait_stream(s)
        for k, f in fns:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(28):
                    f()
            graphs[k] = g
        for _ in range(10):
            for k, g in graphs.items():
                g.replay()
                st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                st.record()
                for _ in range(3):
                    g.replay()
                en.record(); torch.cuda.synchronize()
                t[k].append(st.elapsed_time(en) / 84 * 1000)
        med = {k: round(statistics.median(v), 2) for k, v in t.items()}
        res[f"{name} M={M}"] = dict(us=med, **bits)
        print(name, M, med, bits, flush=True)
json.dump(res, open(os.environ.get("OUT", "/tmp") + "/s11probe2.json", "w"), indent=1)
