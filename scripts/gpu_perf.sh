#!/usr/bin/env bash
# Device calls behind docs/performance.md's issue-18 figures (split-K, sampled async, fair baseline).
#   OUT=/dir bash scripts/gpu_perf.sh splits gap both1          # call 2: graph-timed sweep, step gap, one bench
#   OUT=/dir bash scripts/gpu_perf.sh tests profile both3      # call 3: GPU tests, decode profile, bench-256 x3
#   OUT=/dir bash scripts/gpu_perf.sh hf                        # call 4: bench-256 async, then transformers
#   OUT=/dir bash scripts/gpu_perf.sh tests both3 profile      # call 5: fused elementwise ops (residual stream)
#   OUT=/dir bash scripts/gpu_perf.sh tests both3              # call 6: + longest-first decode order
#   OUT=/dir bash scripts/gpu_perf.sh gemms gemm_probes        # session 5: decode GEMMs (calls 7 and 8 ran each alone)
#   OUT=/dir bash scripts/gpu_perf.sh prefill_ab ops_ab         # session 6: elementwise ops with static hidden sizes
#   OUT=/dir bash scripts/gpu_perf.sh prefill async3            # session 6: + one q/k norm-rope kernel
#   OUT=/dir bash scripts/gpu_perf.sh prefill_attn              # session 7: Triton prefill kernel against FA2
#   OUT=/dir bash scripts/gpu_perf.sh tests prefill_kernel_ab defer_ab gap_defer   # session 7, calls 3-4
#   OUT=/dir bash scripts/gpu_perf.sh tests async3 gap_defer   # session 7, call 5: + prefill steps in flight
# Each part has its own time limit, so one hang cannot take the whole call.
# INFERLAB_CACHE is left to its default: the random model and tiny model are built there once.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv | tee -a "$OUT/gpu.txt"
cat COMMIT 2>/dev/null | tee -a "$OUT/gpu.txt"
# A command, not a shell function, so that `timeout` can run it.
BENCH=(python3 -c "import sys; from inferlab.cli import main; main(sys.argv[1:])" bench --workload bench-256)
# The same bench with the elementwise ops compiled the way they were before session 6.
ALL_DYNAMIC="import sys; sys.path.insert(0, 'scripts'); from profile_prefill import use_all_dynamic_ops
use_all_dynamic_ops(); from inferlab.cli import main; main(sys.argv[1:])"
# The same bench with full collections left to run during the timed loop, as before session 7.
NO_DEFER="import sys, contextlib; import reference.engine.collector as c
c.full_collections_deferred = contextlib.nullcontext; from inferlab.cli import main; main(sys.argv[1:])"
for part in "$@"; do
  echo "=== $part $(date +%T)"
  case "$part" in
    splits) timeout 200 python3 scripts/decode_splits.py --out "$OUT/splits.json" 2>&1 | tee "$OUT/splits.txt" | tail -14 ;;
    tests)
      timeout 240 python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py tests/engine/test_kernels.py \
        tests/engine/test_async_scheduling.py tests/engine/test_fused_ops.py --device cuda --tb=short 2>&1 | tee "$OUT/tests.txt" | tail -4 ;;
    both1) timeout 200 "${BENCH[@]}" --scheduling both --out "$OUT/bench256_both_0.json" 2>&1 | tail -16 ;;
    both3) for i in 1 2 3; do timeout 150 "${BENCH[@]}" --scheduling both --out "$OUT/bench256_both_$i.json" 2>&1 | tail -14; done ;;
    profile) timeout 200 python3 scripts/profile_decode.py --steps 20 2>&1 | tee "$OUT/profile.txt" | tail -45 ;;
    gemms) timeout 480 python3 scripts/decode_gemms.py --part sweep --out "$OUT/decode_gemms.json" 2>&1 | tee "$OUT/decode_gemms.txt" | tail -50 ;;
    gemm_probes) timeout 420 python3 scripts/decode_gemms.py --part probes --out "$OUT/decode_gemm_probes.json" \
      --best "${BEST:-docs/results/2026-11-24/session5/decode_gemms.json}" 2>&1 | tee "$OUT/decode_gemm_probes.txt" | tail -20 ;;
    prefill) timeout 120 python3 scripts/profile_prefill.py --out "$OUT/prefill.json" 2>&1 | tee "$OUT/prefill.txt" | tail -30 ;;
    async3) for i in 1 2 3; do timeout 100 "${BENCH[@]}" --scheduling async --out "$OUT/bench256_async_$i.json" 2>&1 | tail -4; done ;;
    prefill_ab)
      timeout 120 python3 scripts/profile_prefill.py --out "$OUT/prefill_rows.json" 2>&1 | tee "$OUT/prefill_rows.txt" | tail -30
      timeout 120 python3 scripts/profile_prefill.py --all-dynamic --out "$OUT/prefill_all.json" 2>&1 | tee "$OUT/prefill_all.txt" | tail -30 ;;
    ops_ab)   # interleaved on one machine: now, before, now, before, now
      for run in new1 old1 new2 old2 new3; do
        code="import sys; from inferlab.cli import main; main(sys.argv[1:])"; [[ $run == old* ]] && code=$ALL_DYNAMIC
        timeout 110 python3 -c "$code" bench --workload bench-256 --scheduling async --out "$OUT/bench256_async_$run.json" 2>&1 | tail -4
      done ;;
    prefill_attn) timeout 280 python3 scripts/prefill_attention_bench.py --out "$OUT/prefill_attn.json" 2>&1 \
      | tee "$OUT/prefill_attn.txt" | tail -12 ;;
    prefill_kernel_ab)
      timeout 100 python3 scripts/profile_prefill.py --out "$OUT/prefill_triton.json" 2>&1 | tee "$OUT/prefill_triton.txt" | tail -30
      timeout 100 python3 scripts/profile_prefill.py --flash-prefill --out "$OUT/prefill_fa2.json" 2>&1 \
        | tee "$OUT/prefill_fa2.txt" | tail -30 ;;
    defer_ab)   # interleaved: full collections deferred during the run (now), and not (before)
      for run in new1 nodefer1 new2 nodefer2 new3; do
        code="import sys; from inferlab.cli import main; main(sys.argv[1:])"; [[ $run == nodefer* ]] && code=$NO_DEFER
        timeout 100 python3 -c "$code" bench --workload bench-256 --scheduling async --out "$OUT/bench_$run.json" 2>&1 | tail -4
      done ;;
    gap_defer) timeout 150 python3 scripts/step_gap.py --modes async-freeze-defer --out "$OUT/gap_defer.json" 2>&1 | tail -9 ;;
    gap) timeout 240 python3 scripts/step_gap.py --out "$OUT/gap.json" 2>&1 | tail -22 ;;
    hf) timeout 560 "${BENCH[@]}" --compare hf --hf-batch-size 256 --out "$OUT/bench256_async_hf.json" 2>&1 | tail -14 ;;
  esac
done
echo "=== done $(date +%T)"
