#!/usr/bin/env bash
# Train with TorchTitan: validate the job in one process, then launch torchrun.
#
#   ./run_train.sh                                   # train_configs/debug.toml
#   CONFIG_FILE=train_configs/7B.toml NGPU=4 ./run_train.sh --training.steps 100 \
#       --training.dataset_path /data/corpus.jsonl --model.hf_assets_path /models/llama3/original
#
# NGPU: processes (default: every CUDA GPU this process may use: those CUDA_VISIBLE_DEVICES
# names where it is set, else every GPU nvidia-smi lists; with none, 2 CPU processes); a GPU
# config on a multiple of its base count puts the extra GPUs into data parallelism.
# LOG_RANK: ranks whose output is shown (default 0). Extra arguments override the TOML.
# MAX_RESTARTS: torchrun restarts after a worker failure (default 0); each restart resumes
# from the newest complete checkpoint in the dump folder. A stopped job (below) is never
# restarted (boost_titan.torchrun).
# SIGTERM or SIGUSR1 (to this script or its process group): every rank finishes its step,
# one checkpoint of it is saved, and the script exits 75 after the line "stopped by SIGTERM
# at step N; checkpoint saved (...); rerun to continue" ([boost] time_budget_minutes stops
# the same way; a signal during the last step ends with "... training is complete ..." and 0). SHUTDOWN_TIMEOUT: seconds torchrun then waits for the workers before it
# SIGKILLs them (default 600).
#
# A job that fails the check prints one `error:` line (exit 2) and starts no worker; one
# whose checkpoint is already at training.steps says so and exits 0. If a worker stops on
# a user error, its `error:` line ends the output instead of torchrun's failure report.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap_venv.sh

CONFIG_FILE=${CONFIG_FILE:-train_configs/debug.toml}
LOG_RANK=${LOG_RANK:-0}
export PYTHONUNBUFFERED=1

gpus=$(scripts/visible_gpus.sh)
if [[ "$gpus" -gt 0 ]]; then
    NGPU=${NGPU:-$gpus}
else
    NGPU=${NGPU:-2}
    cores=$(nproc)
    threads=$(( cores / NGPU ))
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( threads > 0 ? threads : 1 ))}
fi
MAX_RESTARTS=${MAX_RESTARTS:-0}
export NGPU LOG_RANK
# A fresh TCPStore per torchrun attempt: in torchrun's shared one a restarted attempt finds
# the crashed attempt's process-group keys, and gloo then connects to a dead peer or hangs.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}

status=0
python -m boost_titan.check --nproc "$NGPU" --job.config_file "$CONFIG_FILE" "$@" || status=$?
if [[ $status -eq 4 ]]; then  # boost_titan.check.FINISHED: nothing to train, check said why
    exit 0
fi
[[ $status -eq 0 ]] || exit "$status"

exec python -m boost_titan.torchrun_relay python -m boost_titan.torchrun \
    --nproc_per_node="$NGPU" --rdzv_backend c10d --rdzv_endpoint=localhost:0 \
    --max-restarts "$MAX_RESTARTS" \
    --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
    --shutdown-timeout "${SHUTDOWN_TIMEOUT:-600}" \
    --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
    -m boost_titan.train --job.config_file "$CONFIG_FILE" "$@"
