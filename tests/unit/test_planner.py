"""The memory model (`bench.model.memory`), its check against torch's MemTracker, and the
auto-planner (`python -m boost_titan.plan --auto`)."""

from __future__ import annotations

import dataclasses

import pytest

from boost_titan.bench.model import memory, perfmodel, planner
from boost_titan.bench.model.perfmodel import Plan
from boost_titan.config.errors import ConfigError

GIB = memory.GIB


def request(**kw) -> planner.Request:
    base = dict(
        flavor="1B",
        arch="cola",
        gpus=1,
        gpu="a100",
        gpu_memory_gib=80.0,
        seq_len=4096,
        global_batch=4,
    )
    return planner.Request(**(base | kw))


# ---- memory model -------------------------------------------------------------------------
def test_memory_parts_hand_computed():
    """1B, one sequence, full AC: 4 + 8 bytes of fp32 master weights and AdamW moments per
    parameter; the peak is when backward ends (every fp32 gradient, 4 bytes) with one
    block's bf16 gradient and its fp32 copy (6 bytes per block parameter) and recompute;
    the bf16 compute copy of the lm_head + final norm and of one block (2 bytes)."""
    args = perfmodel.model_args("1B", "cola", "btp")
    plan = Plan("btp", seq_len=4096, microbatches=1, ac="full")
    n, block = perfmodel.params_per_rank(args, plan), perfmodel.layer_params(args, plan)
    head = args.vocab_size * args.dim + args.dim
    m = memory.stage_memory(args, plan)
    recompute = perfmodel.activation_bytes(args, dataclasses.replace(plan, ac="none")) - 4096 * (
        args.dim * 2
    )
    assert m.parts == {
        "weights": 4 * n,
        "optimizer": 8 * n,
        "compute_copy": 2 * (head + block),
        "grads": 4 * n,
        "activations": 0,
        "loss": 0,
        "backward": 6 * block + recompute,
    }
    sharded = memory.stage_memory(args, plan, dp_shard=4).parts
    assert (sharded["weights"], sharded["optimizer"]) == (n, 2 * n)  # FSDP over 4 ranks


def test_memory_pipeline_in_flight():
    """13B TP4 x PP2, 4 micro-batches: 1F1B keeps 2 in flight on the first stage, 1 on the
    last; both hold 20 blocks (TorchTitan's split) and the last adds the loss."""
    args = perfmodel.model_args("13B", "cola", "btp")
    plan = Plan("btp", tp=4, pp=2, seq_len=4096, microbatches=4)
    first, last = (memory.stage_memory(args, plan, s) for s in (0, 1))
    assert memory.stage_layers(40, 2) == [20, 20]
    assert first.parts["activations"] == 2 * last.parts["activations"]
    assert first.parts["loss"] == 0 < last.parts["loss"]
    assert memory.peak_memory(args, plan) == first


@pytest.mark.parametrize("layers,pp", [(40, 2), (36, 4), (60, 4), (4, 4), (32, 8), (24, 3)])
def test_stage_split_is_torchtitans(layers, pp):
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part

    parts = generate_llm_fqn_per_model_part(pp, layers)
    expected = [sum(name.startswith("layers.") for name in part) for part in parts]
    assert memory.stage_layers(layers, pp) == expected


def test_model_matches_memtracker_small_case():
    """The debug flavor on fake tensors, TP1, none and full AC: model within 10 % of torch's
    MemTracker (the full table: `python -m boost_titan.bench memory --check`)."""
    from boost_titan.bench.measure import memtrack

    rows = memtrack.check_rows(memtrack.QUICK_CASES, modes=("none", "full"))
    assert all(abs(r.error) <= memtrack.TOLERANCE for r in rows), memtrack.format_check(rows)


# ---- planner ------------------------------------------------------------------------------
def test_tight_memory_picks_recomputation():
    """1B on one 16 GiB GPU: without AC the activations overflow it; the winner recomputes
    and the best rejected layout is out of memory."""
    result = planner.plan_layouts(request(gpu_memory_gib=16.0))
    assert result.ranked[0].plan.ac != "none"
    assert all(lay.plan.ac != "none" for lay in result.ranked)
    assert result.rejected and all("out of memory by" in lay.reason for lay in result.rejected)


def test_plenty_of_memory_picks_no_recomputation():
    """1B on one 80 GiB GPU: everything fits, so the winner recomputes nothing and runs
    the largest micro-batch (fewest, widest GEMMs)."""
    winner = planner.plan_layouts(request()).ranked[0].plan
    assert (winner.ac, winner.micro_batch, winner.microbatches) == ("none", 4, 1)


@pytest.mark.parametrize(
    "kw",
    [
        dict(flavor="1B", gpus=1, gpu_memory_gib=16.0),
        dict(flavor="13B", gpus=8, gpu="a100-hgx4", global_batch=8),
        dict(flavor="7B", gpus=4, gpu_memory_gib=24.0),
    ],
)
def test_ranked_layouts_fit_the_memory_model(kw):
    """Fails if the planner ranks a layout the memory model says does not fit."""
    result = planner.plan_layouts(request(**kw))
    usable = planner.USABLE * result.request.gpu_memory_gib * GIB
    assert result.ranked
    for lay in result.ranked:
        assert memory.peak_memory(result.args, lay.plan, dp_shard=lay.dp).total <= usable
    steps = [lay.step_s for lay in result.ranked]
    assert steps == sorted(steps)


def test_rejections_name_the_reason():
    sizes = planner.plan_layouts(request(flavor="130M", gpus=8, global_batch=8))
    assert "n_heads 12 is not divisible by tp 8" in sizes.structural
    split = planner.plan_layouts(request(flavor="debug", gpus=8, global_batch=8, seq_len=2048))
    assert "pp 8 exceeds the 6 stage units (layers + embedding + head)" in split.structural


def test_model_that_fits_nowhere_is_one_line():
    with pytest.raises(
        ConfigError, match=r"^30B fits no layout on 1 x 80 GiB; .* needs [\d.]+ GiB"
    ):
        planner.plan_layouts(request(flavor="30B"))


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--auto", "--flavor", "7B"], "--auto needs --gpus N"),
        (["--auto", "--gpus", "0"], "--gpus 0 must be a positive integer"),
        (["--auto", "--gpus", "4", "--gpu", "tpu"], "argument --gpu: invalid choice"),
        (["--auto", "--gpus", "4", "--flavor", "9B"], "unknown flavor '9B'"),
        (["--auto", "--gpus", "4", "--seq-len", "99999"], "exceeds flavor 1B's 4096"),
        (["--auto", "--gpus", "4", "--global-batch", "0"], "--global-batch 0 must be"),
        (["--auto", "--gpus", "4", "--gpu-memory", "-1"], "--gpu-memory -1.0 must be"),
        (["--auto", "--gpus", "four"], "argument --gpus: invalid int value"),
    ],
)
def test_bad_arguments_are_one_line(argv, message, capsys):
    from boost_titan.plan import main

    with pytest.raises(SystemExit) as exit_:
        main(["--flavor", "1B", *argv] if "--flavor" not in argv else argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert message in err


@pytest.mark.parametrize(
    "flavor,gpus,gpu,batch", [("13B", 8, "a100-hgx4", 8), ("1B", 1, "a100", 4)]
)
def test_written_toml_passes_check_and_prices_the_same(flavor, gpus, gpu, batch, tmp_path, capsys):
    """The winner's TOML (and, for 13B, the best pipelined layout's) passes `check
    --nproc N` in process, and `bench model --config` reads back the very plan priced."""
    from boost_titan.bench.model.job import job_plan
    from boost_titan.check import check
    from boost_titan.plan import main

    path = tmp_path / "auto.toml"
    argv = ["--auto", "--flavor", flavor, "--gpus", str(gpus), "--gpu", gpu]
    assert main([*argv, "--global-batch", str(batch), "--write-toml", str(path)]) == 0
    capsys.readouterr()
    result = planner.plan_layouts(request(flavor=flavor, gpus=gpus, gpu=gpu, global_batch=batch))
    layouts = [result.ranked[0]] + [lay for lay in result.ranked if lay.plan.pp > 1][:1]
    assert flavor != "13B" or layouts[-1].plan.pp == 2
    assert path.read_text() == planner.toml_text(result, layouts[0])
    assert f"{layouts[0].step_s:.3f} s per step" in path.read_text().splitlines()[2]
    for i, lay in enumerate(layouts):
        path.write_text(planner.toml_text(result, lay))
        out = str(tmp_path / f"out{i}")
        ok = check(["--nproc", str(gpus), "--job.config_file", str(path), "--job.dump_folder", out])
        assert ok.startswith("config ok:")
        assert job_plan(str(path), gpus).plan == lay.plan
