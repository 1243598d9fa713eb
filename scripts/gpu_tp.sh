#!/usr/bin/env bash
# Tensor parallelism and P/D disaggregation on 2 GPUs: the one-shot all-reduce against NCCL, the GPU tests,
# TP=1 vs TP=2 throughput (Qwen3-8B and 0.6B shapes, decode batch 64 and 256), where a step's GPU time goes,
# colocated vs disaggregated, `inferlab serve` curves at TP=1 and TP=2 (scripts/gpu_tp.py lists the parts).
# Usage (on a 2-GPU machine, from the repository root):  OUT=/tmp/out bash scripts/gpu_tp.sh
#   GPU_TP_PARTS=env,allreduce,...   only these parts (default: env,allreduce,tp_bench,small; the second call
#                                    is gpu_tests,pd,serve; docs/performance.md gives both commands)
#   GPU_TP_BUDGET_S (default 500)    the measured parts stop starting new work past this
# Writes $OUT/gpu_tp.json and $OUT/gpu_tp.log.
# `serve` needs fastapi and uvicorn; without network, put their wheels in .whl/ (docs/performance.md).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # every process inherits these
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_tp_out}
mkdir -p "$OUT"
export INFERLAB_CACHE=${INFERLAB_CACHE:-/tmp/inferlab-cache}
if ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c "import fastapi, uvicorn" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu_tp.log"
timeout "${GPU_TP_TIMEOUT_S:-570}" python3 scripts/gpu_tp.py 2>&1 | tee -a "$OUT/gpu_tp.log"
echo "exit code ${PIPESTATUS[0]}" | tee -a "$OUT/gpu_tp.log"
ps -eo pid,ppid,etime,cmd | grep -E "inferlab|gpu_tp|spawn_main" | grep -v grep | tee -a "$OUT/gpu_tp.log" \
  || echo "no process left behind" | tee -a "$OUT/gpu_tp.log"
