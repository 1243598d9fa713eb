#!/usr/bin/env bash
# Tensor parallelism and P/D disaggregation on 2 GPUs: correctness, TP=1 vs TP=2 throughput,
# all-reduce time per step, colocated vs disaggregated TTFT/TPOT/throughput, KV transfer time.
# Usage (on a 2-GPU machine, from the repository root):  OUT=/tmp/out bash scripts/gpu_tp.sh
# Writes $OUT/gpu_tp.json and $OUT/gpu_tp.log; stays within ~9 minutes (GPU_TP_BUDGET_S, default 500 s
# for the measured parts, plus installation).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # every process inherits these
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_tp_out}
mkdir -p "$OUT"
export INFERLAB_CACHE=${INFERLAB_CACHE:-/tmp/inferlab-cache}
nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 | tee "$OUT/gpu_tp.log"
timeout 540 python3 scripts/gpu_tp.py 2>&1 | tee -a "$OUT/gpu_tp.log"
echo "exit code ${PIPESTATUS[0]}" | tee -a "$OUT/gpu_tp.log"
