#!/usr/bin/env bash
# Device calls behind docs/performance.md's async-scheduling figures (each fits one 10-minute call).
#   OUT=/dir bash scripts/gpu_async.sh tests   # the engine tests on CUDA (about 2 minutes)
#   OUT=/dir bash scripts/gpu_async.sh both    # bench-256 sync then async in one process, twice (about 3 minutes)
#   OUT=/dir bash scripts/gpu_async.sh hf      # bench-256 async, then transformers generate (about 6 minutes)
#   OUT=/dir bash scripts/gpu_async.sh final   # tests, then bench-256 async once (about 4 minutes)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 INFERLAB_CACHE=/tmp/inferlab-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv | tee "$OUT/gpu.txt"
bench() { python3 -c "import sys; from inferlab.cli import main; main(sys.argv[1:])" bench --workload bench-256 "$@"; }
case "${1:-both}" in
  tests)
    python3 -m pytest -q -p no:cacheprovider tests/engine/test_async_scheduling.py tests/engine/test_engine_vs_hf.py \
      tests/engine/test_api.py tests/engine/test_lifecycle.py tests/engine/test_block_manager.py tests/engine/test_scheduler.py \
      tests/engine/test_metrics.py tests/courseware/test_tiny_model.py tests/test_cli.py tests/engine/test_gpu.py tests/engine/test_kernels.py \
      tests/engine/test_flash_attn_contract.py --device cuda --tb=short 2>&1 | tee "$OUT/tests_full.txt" | tail -4 ;;
  both)
    for i in 1 2; do bench --scheduling both --out "$OUT/bench256_both_$i.json" 2>&1 | tail -12; done ;;
  hf)
    bench --compare hf --out "$OUT/bench256_async_hf.json" 2>&1 | tail -12 ;;
  final)
    bash "$0" tests && bench --out "$OUT/bench256_async_final.json" 2>&1 | tail -12 ;;
esac
