#!/usr/bin/env bash
# Print how many CUDA GPUs this process may use: those CUDA_VISIBLE_DEVICES names where it is
# set (CUDA shows a process nothing else; "" hides every GPU), else every GPU nvidia-smi
# lists; 0 without nvidia-smi. run_train.sh's default NGPU.
set -euo pipefail
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU' || true)
fi
if [[ "$gpus" -gt 0 && -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    IFS=',' read -r -a visible <<< "$CUDA_VISIBLE_DEVICES"
    gpus=${#visible[@]}
fi
echo "$gpus"
