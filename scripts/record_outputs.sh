#!/usr/bin/env bash
# Record what the commands print, to compare a refactor's before and after:
#   scripts/record_outputs.sh OUTDIR [NAME_REGEX]     (then scripts/compare_outputs.py A B)
# Every --help, the analytic model's outputs, plan --auto for each request in the docs and the
# TOML it writes, activation_memory, params, hf_refusals, readme_tables --check. Each file
# holds stdout+stderr and the exit code; the checkout's path is replaced by ROOT.
set -u
out="$(realpath -m "$1")"; only="${2:-.}"; mkdir -p "$out"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT  # files the commands write
WT="$(cd "$(dirname "$0")/.." && pwd)"; cd "$WT" && source scripts/bootstrap_venv.sh >/dev/null 2>&1
run() {  # run NAME CMD...
    local name="$1"; shift
    [[ "$name" =~ $only ]] || return 0
    { "$@" 2>&1; echo "rc=$?"; } | sed -e "s#$WT#ROOT#g" -e "s#$tmp#TMP#g" > "$out/$name.txt"
}
for m in train check plan export eval generate activation_memory loss_compare torchrun_relay bench; do
    run "help_$m" python -m boost_titan.$m --help
done
for s in model precision validate plot trace memory cpu compile step; do
    run "help_bench_$s" python -m boost_titan.bench $s --help
done
B="python -m boost_titan.bench"
run model_default $B model
run model_7B_breakdown $B model --flavor 7B --tp 4 --gpu a100-hgx4 --breakdown
run model_json $B model --flavor 1B,3B --tp 2,4 --json -
run model_sweep $B model --flavor 1B,7B,30B --strategy megatron,vanilla,btp --tp 2,4,8 --gpu a100,h100
run model_config $B model --config train_configs/7B.toml --nproc 4
run model_float8 $B model --flavor 7B --tp 4 --gpu h100 --float8 tensorwise --compile --breakdown
run model_pp $B model --flavor 13B --tp 4 --pp 2 --microbatches 4 --ac lowrank --overlap-chunks 2
run model_pp_full $B model --flavor 13B --tp 4 --pp 2 --microbatches 4 --ac full --overlap-chunks 2 --breakdown
run model_cudagraphs $B model --flavor 1B --tp 2 --gpu h100 --cuda-graphs --no-master-weights
run model_plotfile $B model --flavor 1B --tp 2,4 --plot "$tmp/plot.png"
run precision $B precision
run precision_config $B precision --config train_configs/1B.toml,train_configs/7B.toml,train_configs/13B.toml
run validate $B validate
run validate_h100_json $B validate --gpu h100 --ac lowrank --json -
run validate_h100_sel $B validate --gpu h100 --ac selective --json -
run trace_compare $B trace --flavor 1B --tp 2 --compare
run trace_json $B trace --flavor debug --seq-len 256 --strategy megatron,vanilla,btp --tp 2 --json -
run trace_debug_noseq $B trace --flavor debug --tp 2
run memory_model $B memory --flavor 13B --tp 4 --pp 2
run memory_check_quick $B memory --check --quick
run bad_model $B model --flavor 99B
run plan_btp_debug python -m boost_titan.plan --strategy btp --flavor debug --markdown
run plan_megatron python -m boost_titan.plan --strategy megatron --tp 4
run act_mem python -m boost_titan.activation_memory --flavor debug --seq-len 256
run act_mem_tp python -m boost_titan.activation_memory --flavor debug --seq-len 256 --tp 2
i=0
grep -o 'python -m boost_titan.plan --auto [^`]*' docs/planner.md docs/gpus.md README.md | cut -d: -f2- | sed 's/ *\\$//' | sort -u | while read -r cmd; do
    i=$((i+1)); cmd="${cmd%% --write-toml*}"
    run "plan_auto_$(echo "$cmd" | sed 's/python -m boost_titan.plan --auto //; s/[^A-Za-z0-9]\+/_/g')" $cmd
done
run plan_auto_toml python -m boost_titan.plan --auto --flavor 7B --gpus 8 --gpu h100 --global-batch 32 --write-toml "$tmp/written.toml"
[[ plan_auto_toml =~ $only ]] && cp "$tmp/written.toml" "$out/plan_auto_written.toml"
run plan_auto_bad python -m boost_titan.plan --auto --flavor 30B --gpus 1 --gpu a100
run plan_auto_md python -m boost_titan.plan --auto --flavor 3B --gpus 8 --gpu h100 --global-batch 32 --markdown --top 5 --overlap
run readme_tables python scripts/readme_tables.py --help
run params python -m boost_titan.boost_llama
run hf_refusals python -m boost_titan.hf_refusals
run act_mem_1B python -m boost_titan.activation_memory --flavor 1B --seq-len 2048 --tp 4
run readme_tables_check python scripts/readme_tables.py --check
