#!/usr/bin/env bash
# Device call behind docs/performance.md's serving curve (one 10-minute call on one GPU):
#   OUT=/dir bash scripts/gpu_serve.sh
# Serves the Qwen3-0.6B-shape model (random weights, bf16) with `inferlab serve`, then loads it with
# `inferlab bench serve` at rising Poisson rates up to saturation. The GPU machine has no network:
# FastAPI, Starlette, uvicorn and pydantic travel as wheels in .whl/ (carry it).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 INFERLAB_CACHE=/tmp/inferlab-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
inferlab() { python3 -c "import sys; from inferlab.cli import main; sys.exit(main(sys.argv[1:]))" "$@"; }
model=$(python3 -c "from courseware.bench import make_random_model, random_model_dir; print(make_random_model(random_model_dir('qwen3-0.6b', 'bfloat16')))" | tail -1)
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
inferlab serve "$model" --port 8321 --served-model-name qwen3-0.6b-random --dtype bfloat16 \
  --lifecycle-log "$OUT/serve_lifecycle.jsonl" --async-scheduling > "$OUT/server.txt" 2>&1 &
server=$!
for _ in $(seq 1 180); do curl -sf http://127.0.0.1:8321/health >/dev/null && break; sleep 1; done
# 300 prompts per rate, 102-921 tokens in and 51-460 out (random token ids, ignore_eos).
inferlab bench serve --url http://127.0.0.1:8321 --num-prompts 300 --random-input-len 512 --random-output-len 256 \
  --random-range-ratio 0.8 --request-rate 8 16 32 64 128 inf --goodput ttft:500 tpot:50 \
  --out "$OUT/serve_curve.json" --plot "$OUT/serve_curve.png" 2>&1 | tee "$OUT/bench_serve.txt"
curl -s http://127.0.0.1:8321/metrics > "$OUT/metrics.txt"
kill -INT $server; wait $server
echo "server exit status $?"
