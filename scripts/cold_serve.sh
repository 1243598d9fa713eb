#!/usr/bin/env bash
# The first requests after a server starts: `inferlab serve` (Qwen3-8B shape, random bf16, async scheduling,
# a lifecycle log), then `bench serve` at 8 req/s twice (32 prompts of 256 tokens, 32 output tokens each).
# Prints each run's first 12 TTFTs (ms) and every pause of the engine over 0.1 s, from the lifecycle log.
# Usage (GPU machine, repository root):  OUT=/dir bash scripts/cold_serve.sh [TP] [PORT]
# Without network, put fastapi, uvicorn and their dependencies' wheels in .whl/ (docs/performance.md).
set -u
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 INFERLAB_CACHE=/tmp/inferlab-cache
TP=${1:-1}; PORT=${2:-18555}; D=$OUT/tp$TP; mkdir -p $D
if ! python3 -c "import fastapi, uvicorn" 2>/dev/null; then
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
MODEL=$(python3 -c "
import sys, torch; sys.path.insert(0, 'scripts')
from gpu_tp import model_8b; print(model_8b())" 2>/dev/null | tail -1)
echo "model $MODEL"
date +%T
python3 -m inferlab.cli serve "$MODEL" --port $PORT --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 1024 --async-scheduling --tensor-parallel-size $TP --lifecycle-log $D/life.jsonl > $D/server.log 2>&1 &
SERVER=$!
for i in $(seq 1 240); do curl -s localhost:$PORT/health >/dev/null && break; sleep 0.5; done
date +%T
for r in 1 2; do
  python3 -m inferlab.cli bench serve --url http://127.0.0.1:$PORT --num-prompts 32 --random-input-len 256 --random-output-len 32 --request-rate 8 --out $D/bench$r.json > $D/bench$r.log 2>&1
  date +%T; tail -3 $D/bench$r.log | head -1
done
kill -INT $SERVER; wait $SERVER; export D
python3 - <<'PY'
import json, os
ev = [json.loads(l) for l in open(os.environ["D"] + "/life.jsonl")]
steps = [e for e in ev if e["event"] == "STEP"]
t0 = ev[0]["time"]
prev = None
print("events", len(ev), "steps", len(steps))
for e in ev:
    if prev is not None and e["time"] - prev["time"] > 0.1 and e["event"] != "ARRIVED":
        print(f"gap {e['time'] - prev['time']:.3f} s at t={prev['time'] - t0:.2f}: after {prev['event']} seq {prev['seq_id']} step {prev['step']} -> {e['event']} seq {e['seq_id']}")
    prev = e
for r in (1, 2):
    d = json.load(open(os.environ["D"] + f"/bench{r}.json"))
    print(r, [round(x["ttft"] * 1e3) for x in d["runs"][0]["requests"][:12]])
PY
