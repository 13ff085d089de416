#!/usr/bin/env bash
# Loop the restart jobs and a plain run: every one must exit 0 (a finished run never reports
# failure) and every restarted run must log the uninterrupted run's losses bit for bit.
#
#   scripts/restart_loop.sh [ITERATIONS] [OUT]     (default 20 iterations into /tmp/restart_loop)
#
# Per iteration, on 2 CPU processes (BTP TP=2, 10 steps, checkpoint every 3), as
# tests/distributed/test_reliability.py runs them: run_train.sh with MAX_RESTARTS=1 where
# rank 1 SIGKILLs itself after step 5, the same during an async save of step 6, and a plain
# torchrun run. Prints one line per job and a summary; exit 1 if any job failed.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap_venv.sh
N=${1:-20}
OUT=${2:-/tmp/restart_loop}
rm -rf "$OUT" && mkdir -p "$OUT"
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
COMMON=(--training.steps 10 --training.seq_len 64 --training.local_batch_size 4
    --metrics.log_freq 1 --metrics.no_enable_tensorboard --lr_scheduler.warmup_steps 6
    --lr_scheduler.total_steps 10 --checkpoint.interval 3 --checkpoint.keep_latest_k 0
    --debug.seed 7 --debug.deterministic)

plain() {  # plain DUMP: torchrun without restarts, every rank's output
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 python -m torch.distributed.run --nproc_per_node=2 \
        --rdzv_backend=c10d --rdzv_endpoint=localhost:0 --tee 3 -m boost_titan.train \
        --job.config_file train_configs/debug.toml --job.dump_folder "$1" "${COMMON[@]}"
}

same_losses() {  # same_losses DUMP: the last 7 steps equal the reference's steps 4-10
    python - "$OUT/reference/losses.jsonl" "$1/losses.jsonl" <<'EOF'
import sys
from boost_titan.runtime.run_log import read_log
rows = [[(r["step"], r["loss"]) for r in read_log(path)[0]] for path in sys.argv[1:]]
sys.exit(0 if rows[1][-7:] == rows[0][3:] else 1)
EOF
}

plain "$OUT/reference" > "$OUT/reference.out" 2>&1 || { echo "reference run failed"; exit 1; }
failed=0
for i in $(seq 1 "$N"); do
    for fault in "step 5" "save 6"; do
        read -r point step <<< "$fault"
        dump="$OUT/$i-restart-$point"
        extra=()
        [[ $point == save ]] && extra=(--checkpoint.async_mode async)
        NGPU=2 MAX_RESTARTS=1 LOG_RANK=0,1 BOOST_TITAN_FAULT_STEP=$step BOOST_TITAN_FAULT_RANK=1 \
            BOOST_TITAN_FAULT_POINT=$point ./run_train.sh --job.dump_folder "$dump" \
            "${COMMON[@]}" "${extra[@]}" > "$dump.out" 2>&1
        rc=$?
        same_losses "$dump" && exact=yes || exact=no
        echo "iteration $i restart-$point: exit $rc, losses exact: $exact"
        [[ $rc == 0 && $exact == yes ]] || failed=$((failed + 1))
        rm -rf "$dump"
    done
    plain "$OUT/$i-plain" > "$OUT/$i-plain.out" 2>&1
    rc=$?
    echo "iteration $i plain: exit $rc"
    [[ $rc == 0 ]] || failed=$((failed + 1))
    rm -rf "$OUT/$i-plain"
done
aborts=$(grep -l "SIGABRT\|terminate called" "$OUT"/*.out | wc -l)
echo "$((3 * N)) jobs, $failed failed, $aborts outputs mention an abort (logs: $OUT)"
[[ $failed == 0 && $aborts == 0 ]]
