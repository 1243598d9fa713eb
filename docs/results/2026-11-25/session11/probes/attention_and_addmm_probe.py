"""Session 11 probe (call 1): (1) prefill attention micro-variants; (2) residual add in the o/down GEMM (addmm beta=1).

Run from the repo root at 90ad640, with prefill_attention_variants.patch applied (`git apply`): python3 docs/results/2026-11-25/session11/probes/attention_and_addmm_probe.py
(it uses ElementwiseOps.fused().add_rms_norm, which 8f743c1 removed). Writes $OUT/s11probe.json.
"""
import itertools, json, os, statistics, sys, time
import torch
sys.path.insert(0, "."); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, "scripts")
import prefill_attention_bench as pab
import reference.kernels.prefill_attention as v2   # with prefill_attention_variants.patch applied (git apply)
out_dir = os.environ.get("OUT", "/tmp")
res = {}
torch.manual_seed(0)
new = pab.second_prefill_step()
case = pab.make_case(new, [0] * len(new), packed_v=True)
want = pab.fa2(case)
configs = [dict(block_m=64, block_n=32, num_warps=4, num_stages=3, group_heads=True),
           dict(block_m=64, block_n=64, num_warps=4, num_stages=3, group_heads=True),
           dict(block_m=64, block_n=32, num_warps=4, num_stages=4, group_heads=True),
           dict(block_m=128, block_n=64, num_warps=8, num_stages=3, group_heads=True),
           dict(block_m=128, block_n=32, num_warps=8, num_stages=3, group_heads=True),
           dict(block_m=128, block_n=64, num_warps=4, num_stages=3, group_heads=True),
           dict(block_m=128, block_n=128, num_warps=8, num_stages=3, group_heads=False),
           dict(block_m=128, block_n=64, num_warps=8, num_stages=2, group_heads=False)]
rows = []
for rnd in range(2):
    for cfg, (aid, fma) in itertools.product(configs, [(False, False), (True, False), (False, True), (True, True)]):
        fn = lambda: v2.prefill_attention(case["q"], case["k"], case["v"], case["cu_q"], case["cu_k"], case["max_q"],
                                          case["scale"], acc_in_dot=aid, fma_scale=fma, **cfg)
        r = pab.measure(f"r{rnd} {pab.config_name(cfg)} acc_in_dot={aid} fma={fma}", fn, case, want, 20)
        rows.append(r)
        print(r.get("name"), round(r.get("ms", -1), 4), round(r.get("tflops", -1), 1), r.get("rel_err_vs_fa2"), flush=True)
res["attention"] = rows

# (2) residual add in the GEMM epilogue
from reference.models.qwen3 import ElementwiseOps
ops = ElementwiseOps.fused()
M, H = 16384, 1024
w = torch.randn(H, device="cuda", dtype=torch.bfloat16)
res["addmm"] = {}
for name, K in (("o_proj", 2048), ("down_proj", 3072)):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    W = torch.randn(H, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    r0 = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
    def base():
        o = torch.nn.functional.linear(x, W)
        return ops.add_rms_norm(o, r0, w, 1e-6)
    def fused():
        r2 = torch.addmm(r0, x, W.t())
        return ops.rms_norm(r2, w, 1e-6), r2
    def mm_only():
        return torch.nn.functional.linear(x, W)
    def addmm_only():
        return torch.addmm(r0, x, W.t())
    hb, rb = base(); hf, rf = fused()
    diff_r = float((rb != rf).float().mean()); diff_h = float((hb != hf).float().mean())
    t = {k: [] for k in ("base", "fused", "mm", "addmm")}
    for _ in range(3):
        base(); fused(); mm_only(); addmm_only()
    for _ in range(10):
        for k, f in (("base", base), ("fused", fused), ("mm", mm_only), ("addmm", addmm_only)):
            t[k].append(pab.per_layer_ms(f, 3))
    med = {k: statistics.median(v) for k, v in t.items()}
    res["addmm"][name] = dict(ms=med, frac_resid_bits_differ=diff_r, frac_h_bits_differ=diff_h,
                              max_abs_resid_diff=float((rb.float() - rf.float()).abs().max()))
    print(name, med, "differ r", diff_r, "h", diff_h, flush=True)
json.dump(res, open(f"{out_dir}/s11probe.json", "w"), indent=1)
