#!/usr/bin/env bash
# The checks of one short GPU session, as one prepared script (docs/gpus.md#first-checks-on-a-new-machine).
#
#   scripts/gpu_check.sh [OUT]        (OUT: results folder; default $OUT, else /tmp/gpu_check)
#
# Stages (STAGES="kernels steps graphs loro", the default; each time-boxed by TIMEOUT seconds,
# a failed stage does not stop the next):
#   kernels  the Triton kernel tests (tests/unit/test_kernels.py)
#   steps    `bench step` on train_configs/$FLAVOR.toml (default 1B), compiled, TP1: CoLA and
#            full rank at micro-batch 1 x 4 accumulation and 4 x 1, and 1 x 4 with CUDA graphs
#   graphs   the same 8 training steps three times (eager twice, CUDA graphs once, seed 7):
#            losses and exact grad norms compared row by row (eager vs eager first: a GPU
#            may not repeat itself; then graphs vs eager); each run's first-step memory
#            (CUDA max reserved) against the memory model's prediction
#   loro     LORO's dense exact step (scripts/bench_loro_exact.py) at 130M, 1B and 7B pair
#            sizes: measured seconds, GEMM / QR / SVD rates, and the perf model's figure
# $OUT/summary.txt collects the reports. On a machine without CUDA every stage runs on the
# CPU (use FLAVOR=debug there to rehearse the script: CUDA graphs then do nothing).
# With a .whl folder (the recipe's wheels) they are installed into /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/gpu_check}}
STAGES=${STAGES:-kernels steps graphs loro}
FLAVOR=${FLAVOR:-1B}
TIMEOUT=${TIMEOUT:-240}
CONFIG=train_configs/$FLAVOR.toml
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
if [[ -d .whl ]]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    ln -sfn ../parallelize boost_titan/parallelize
    ln -sfn ../kernels boost_titan/kernels
    export PYTHONPATH=$PWD:/tmp/site TORCHINDUCTOR_CACHE_DIR=/tmp/inductor \
        BOOST_TITAN_CACHE=/tmp/btcache
fi
TOY=()  # the built-in corpus on a 1B+ model: fine for timing, say so if check asks
if $PY -m boost_titan.check --job.config_file "$CONFIG" 2>&1 | grep -q allow_toy_corpus; then
    TOY=(--boost.allow_toy_corpus)
fi
TP1=(--parallelism.tensor_parallel_degree 1)  # one GPU: NCCL TP cannot run there
BATCH_1x4=(--training.local_batch_size 1 --training.global_batch_size 4)
BATCH_4x1=(--training.local_batch_size 4 --training.global_batch_size 4)

step() {  # step NAME ARGS...: one bench step report
    local name=$1
    shift
    echo "== step $name"
    timeout "$TIMEOUT" $PY -m boost_titan.bench step --steps 3 --warmup 2 \
        --json "$OUT/step_$name.json" --job.config_file "$CONFIG" --compile.enable \
        "${TP1[@]}" "${TOY[@]}" "$@" >"$OUT/step_$name.txt" 2>&1
    echo "exit $? $(grep -m1 'tokens/s' "$OUT/step_$name.txt")"
}

train() {  # train NAME ARGS...: 8 logged steps into $OUT/train_NAME
    local name=$1
    shift
    echo "== train $name"
    rm -rf "$OUT/train_$name"
    timeout "$TIMEOUT" $PY -m torch.distributed.run --nproc_per_node=1 --rdzv_backend=c10d \
        --rdzv_endpoint=localhost:0 -m boost_titan.train --job.config_file "$CONFIG" \
        --job.dump_folder "$OUT/train_$name" --training.steps 8 --metrics.log_freq 1 \
        --checkpoint.no_enable --validation.no_enable --metrics.no_enable_tensorboard \
        --debug.seed 7 --compile.enable "${TP1[@]}" "${BATCH_1x4[@]}" "${TOY[@]}" "$@" \
        >"$OUT/train_$name.txt" 2>&1
    echo "exit $? $(grep -m1 -o 'memory at step .*' "$OUT/train_$name.txt")"  # vs the model
}

same_rows() {  # same_rows A B: losses.jsonl of two runs, equal bit for bit?
    $PY - "$OUT/train_$1/losses.jsonl" "$OUT/train_$2/losses.jsonl" <<'EOF'
import json, sys
def rows(path):
    with open(path) as f:
        return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, f) if "grad_norm" in r]
a, b = (rows(p) for p in sys.argv[1:])
same = sum(x == y for x, y in zip(a, b))
worst = max((abs(x[1] - y[1]) for x, y in zip(a, b)), default=float("nan"))
print(f"{sys.argv[1]} vs {sys.argv[2]}: {same} of {len(a)} steps equal bit for bit "
      f"(loss and grad norm), largest loss difference {worst:.3g}")
EOF
}

for stage in $STAGES; do
    case $stage in
    kernels)
        echo "== kernels"
        timeout "$TIMEOUT" $PY -m pytest -q tests/unit/test_kernels.py >"$OUT/kernels.txt" 2>&1
        echo "exit $? $(tail -1 "$OUT/kernels.txt")"
        ;;
    steps)
        step cola_1x4 "${BATCH_1x4[@]}"
        step cola_1x4_graphs "${BATCH_1x4[@]}" --boost.cuda_graphs
        step full_1x4 --boost.arch fullrank "${BATCH_1x4[@]}"
        step full_1x4_graphs --boost.arch fullrank "${BATCH_1x4[@]}" --boost.cuda_graphs
        step cola_4x1 "${BATCH_4x1[@]}"
        step full_4x1 --boost.arch fullrank "${BATCH_4x1[@]}"
        ;;
    graphs)
        train eager
        train eager_again
        train graphs --boost.cuda_graphs
        same_rows eager eager_again
        same_rows eager graphs
        ;;
    loro)
        echo "== loro"
        sizes=2048x768x256,5472x2048x512,11008x4096x1024  # 130M, 1B, 7B pairs
        device=$($PY -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
        [[ $device == cpu ]] && sizes=688x256x64,1376x512x128  # a rehearsal: small pairs
        timeout "$TIMEOUT" $PY scripts/bench_loro_exact.py --device "$device" \
            --sizes "$sizes" >"$OUT/loro.txt" 2>&1
        echo "exit $? (loro.txt below)"
        ;;
    *) echo "unknown stage $stage" ;;
    esac
done 2>&1 | tee "$OUT/summary.txt"
for report in "$OUT"/step_*.txt "$OUT"/loro.txt; do
    [[ -f $report ]] && { echo "== $report"; cat "$report"; } >>"$OUT/summary.txt"
done
