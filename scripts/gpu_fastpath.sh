#!/usr/bin/env bash
# One device call for the GPU fast path: tests, quick bench, bench-256 vs transformers, decode profile.
# Usage (on the GPU machine, repo root): OUT=/some/dir bash scripts/gpu_fastpath.sh
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 INFERLAB_CACHE=/tmp/inferlab-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m inferlab.cli --help >/dev/null 2>&1 || true
run() { echo "== $*"; "$@"; }
ENGINE_TESTS="tests/engine/test_engine_vs_hf.py tests/engine/test_api.py tests/engine/test_lifecycle.py tests/engine/test_block_manager.py tests/engine/test_scheduler.py tests/engine/test_metrics.py tests/courseware/test_tiny_model.py tests/test_cli.py tests/engine/test_gpu.py tests/engine/test_kernels.py"
run python3 -m pytest -q -p no:cacheprovider $ENGINE_TESTS --device cuda --tb=short 2>&1 | tee "$OUT/tests_full.txt" | tail -5 | tee "$OUT/tests.txt"
run python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py tests/engine/test_kernels.py -s 2>&1 | grep -E "rel. error|share|passed|failed" | tee -a "$OUT/tests.txt"

run python3 -c "from inferlab.cli import main; main(['bench','--workload','bench-256','--compare','hf','--out','$OUT/bench256.json'])" 2>&1 | tail -14
run python3 scripts/profile_decode.py --steps 20 2>&1 | grep -v -E "^ +[0-9]+ +[0-9.]+ " | tee "$OUT/profile.txt"
