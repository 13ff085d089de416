"""The memory model (`perf.memory`), its check against torch's MemTracker, and the
auto-planner (`python -m boost_titan.plan --auto`)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex

import pytest

from boost_titan.config.errors import ConfigError
from boost_titan.perf import activations, block, layout, layout_search, memory
from boost_titan.perf.layout import TrainingLayout
from tests.helpers import ROOT
from tests.helpers.corpus import real_data_args

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

GIB = memory.GIB


def request(**kw) -> layout_search.Request:
    base = dict(
        flavor="1B",
        arch="cola",
        gpus=1,
        gpu="a100",
        gpu_memory_gib=80.0,
        seq_len=4096,
        global_batch=4,
    )
    return layout_search.Request(**(base | kw))


# ---- memory model -------------------------------------------------------------------------
def test_memory_parts_hand_computed():
    """1B, one sequence, full AC: 4 + 8 bytes of fp32 master weights and AdamW moments per
    parameter (sharded by FSDP). At seq 4096 the peak is the loss at the end of forward:
    the kept activations, the loss's temporaries and the bf16 compute copy (2 bytes), of
    every weight where nothing is sharded (`runtime.accumulation` keeps them from the first
    forward), of one block and the lm_head + final norm under FSDP. At seq 512 it is when
    backward ends (every fp32 gradient, 4 bytes) with one block's bf16 gradient and its fp32
    copy (6 bytes per block parameter) and recompute: the backward of the step's only
    micro-batch has freed each block's copy after the block; with 2 micro-batches every
    copy is alive at the end of the first's backward."""
    args = layout.trained_shape("1B", "cola", "btp")
    plan = TrainingLayout("btp", seq_len=4096, microbatches=1, ac="full")
    n, per_block = block.params_per_rank(args, plan), block.layer_params(args, plan)
    head = args.vocab_size * args.dim + args.dim
    one_copy = 2 * (head + per_block)
    at_loss = {
        "grads": 0,
        "activations": args.n_layers * activations.activation_bytes(args, plan),
        "loss": (memory.LOSS_BYTES * args.vocab_size + 2 * args.dim) * 4096,
        "backward": 0,
    }
    assert memory.stage_memory(args, plan, dp_shard=4).parts == {
        "weights": n,
        "optimizer": 2 * n,
        "compute_copy": one_copy,
        **at_loss,
    }
    assert memory.stage_memory(args, plan).parts == {
        "weights": 4 * n,
        "optimizer": 8 * n,
        "compute_copy": 2 * n,
        **at_loss,
    }
    short = dataclasses.replace(plan, seq_len=512)
    recompute = activations.activation_bytes(args, dataclasses.replace(short, ac="none")) - 512 * (
        args.dim * 2
    )
    assert memory.stage_memory(args, short).parts == {
        "weights": 4 * n,
        "optimizer": 8 * n,
        "compute_copy": one_copy,
        "grads": 4 * n,
        "activations": 0,
        "loss": 0,
        "backward": 6 * per_block + recompute,
    }
    two = memory.stage_memory(args, dataclasses.replace(short, microbatches=2)).parts
    assert two["compute_copy"] == 2 * n and two["grads"] == 4 * n


def test_memory_pipeline_in_flight():
    """13B TP4 x PP2, 4 micro-batches: 1F1B keeps 2 in flight on the first stage, 1 on the
    last; both hold 20 blocks (TorchTitan's split) and the last adds the loss."""
    args = layout.trained_shape("13B", "cola", "btp")
    plan = TrainingLayout("btp", tp=4, pp=2, seq_len=4096, microbatches=4)
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
    result = layout_search.plan_layouts(request(gpu_memory_gib=16.0))
    assert result.ranked[0].plan.ac != "none"
    assert all(lay.plan.ac != "none" for lay in result.ranked)
    assert result.rejected and all("out of memory by" in lay.reason for lay in result.rejected)


def test_plenty_of_memory_picks_no_recomputation():
    """1B on one 80 GiB GPU: everything fits, so the winner recomputes nothing and runs
    the largest micro-batch (fewest, widest GEMMs)."""
    winner = layout_search.plan_layouts(request()).ranked[0].plan
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
    result = layout_search.plan_layouts(request(**kw))
    usable = layout_search.USABLE * result.request.gpu_memory_gib * GIB
    assert result.ranked
    for lay in result.ranked:
        assert memory.peak_memory(result.args, lay.plan, dp_shard=lay.dp).total <= usable
    steps = [lay.step_s for lay in result.ranked]
    assert steps == sorted(steps)


def test_rejections_name_the_reason():
    sizes = layout_search.plan_layouts(request(flavor="130M", gpus=8, global_batch=8))
    assert "n_heads 12 is not divisible by tp 8" in sizes.structural
    split = layout_search.plan_layouts(
        request(flavor="debug", gpus=8, global_batch=8, seq_len=2048)
    )
    assert "pp 8 exceeds the 6 stage units (layers + embedding + head)" in split.structural


def test_model_that_fits_nowhere_leads_with_the_fix():
    """30B on one 80 GiB GPU: the fewest GPUs that fit it (4: 2 and 3 do not) and the
    memory one GPU would need come first, then the smallest layout's peak."""
    fix = r"^30B fits no layout on 1 x 80 GiB; use --gpus 4 \(the fewest that fit it\) or GPUs"
    with pytest.raises(ConfigError, match=fix + r" of ([\d.]+) GiB or more .* needs \1 GiB"):
        layout_search.plan_layouts(request(flavor="30B"))
    assert layout_search.plan_layouts(request(flavor="30B", gpus=4)).ranked
    for gpus in (2, 3):
        with pytest.raises(
            ConfigError, match=f"^30B fits no layout on {gpus} x 80 GiB; use --gpus 4 "
        ):
            layout_search.plan_layouts(request(flavor="30B", gpus=gpus))


def test_batch_that_no_layout_takes_leads_with_the_fix():
    """30B on 64 H100 with BOOST's batch of 4: no layout splits 4 sequences over 64 GPUs
    (TP stays in an 8-GPU node, a pipeline needs a micro-batch per stage). The error names
    --global-batch 8 (the smallest that plans: 5-7 do not) and --gpus 32 (the most that
    take 4), each of which plans; not the 13 reasons."""
    h100 = dict(flavor="30B", gpus=64, gpu="h100")
    with pytest.raises(ConfigError) as error:
        layout_search.plan_layouts(request(**h100))
    message = str(error.value)
    assert message.startswith("no layout of 30B on 64 GPUs takes a global batch of 4 sequences")
    assert message.endswith(
        "pass --global-batch 8 (the smallest that a layout on 64 GPUs takes) or --gpus 32 "
        "(the most that take global batch 4)"
    )
    assert layout_search.plan_layouts(request(**h100, global_batch=8)).ranked
    assert layout_search.plan_layouts(request(**(h100 | {"gpus": 32}))).ranked
    for batch in (5, 6, 7):
        with pytest.raises(ConfigError, match="^no layout of 30B on 64 GPUs takes"):
            layout_search.plan_layouts(request(**h100, global_batch=batch))


@pytest.mark.parametrize(
    "kw",
    [
        dict(flavor="30B", gpus=64, gpu="h100"),
        dict(flavor="30B", gpus=3),
        dict(flavor="13B", gpus=48, gpu="h100", global_batch=2),
        dict(flavor="30B", gpus=16, gpu="h100", gpu_memory_gib=12.0, global_batch=1),
    ],
)
def test_every_fix_an_error_suggests_plans(kw):
    """Each `--global-batch N` / `--gpus N` an infeasible request's error suggests plans
    (the last request fits no batch on its 16 small GPUs: no batch is suggested)."""
    with pytest.raises(ConfigError) as error:
        layout_search.plan_layouts(request(**kw))
    fixes = re.findall(r"--(global-batch|gpus) (\d+)", str(error.value))
    assert fixes or kw.get("gpu_memory_gib") == 12.0, str(error.value)
    for flag, value in fixes:
        field = "global_batch" if flag == "global-batch" else "gpus"
        assert layout_search.plan_layouts(request(**(kw | {field: int(value)}))).ranked


def test_a_batch_smaller_than_the_gpus_gets_a_note(capsys):
    """7B on 8 H100 with 4 sequences per step: at most 4 replicas, said in a note that
    names the batch for every GPU; 32 sequences: no note."""
    from boost_titan.plan import main

    argv = ["--auto", "--flavor", "7B", "--gpus", "8", "--gpu", "h100", "--top", "1"]
    assert main(argv) == 0
    note = "note: global batch 4 allows at most 4 data-parallel replicas on 8 GPUs"
    assert note in capsys.readouterr().out
    assert main([*argv, "--global-batch", "32"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_overlap_chunks_only_when_asked_for():
    """Chunked all-reduces are unmeasured on GPUs: ranked only with --overlap."""
    default = layout_search.plan_layouts(request(flavor="7B", gpus=4))
    assert {lay.plan.overlap_chunks for lay in default.ranked} == {1}
    asked = layout_search.plan_layouts(request(flavor="7B", gpus=4, overlap=True))
    assert {lay.plan.overlap_chunks for lay in asked.ranked} == {1, 2, 4}


def test_names_in_any_case(capsys):
    from boost_titan.plan import main

    assert main(["--auto", "--flavor", "7b", "--gpus", "4", "--gpu", "H100", "--top", "1"]) == 0
    assert capsys.readouterr().out.startswith("7B cola on 4 x h100")


def test_a_closed_pipe_ends_quietly():
    """`plan --auto ... | head`: the reader is gone before the table is written; no
    traceback, status 0."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    argv = [sys.executable, "-m", "boost_titan.plan", "--auto", "--flavor", "1B", "--gpus", "1"]
    result = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    os.close(write)
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--auto", "--flavor", "7B"], "--auto needs --gpus N"),
        (["--auto", "--gpus", "0"], "--gpus 0 must be a positive integer"),
        (["--auto", "--gpus", "4", "--gpu", "tpu"], "argument --gpu: invalid choice"),
        (["--auto", "--gpus", "4", "--flavor", "9B"], "unknown flavor '9B'"),
        (["--auto", "--gpus", "4", "--seq-len", "-5"], "--seq-len -5 must be a positive integer"),
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


@pytest.fixture(scope="module")
def real_data(tmp_path_factory) -> list[str]:
    return real_data_args(tmp_path_factory.mktemp("real-data"))


def _checked(path, gpus: int, real_data: list[str], out) -> dict:
    """The TOML at `path` after `check --nproc gpus` passed it (with real data)."""
    from tests.helpers.commands import check

    args = ["--nproc", str(gpus), "--job.config_file", str(path), *real_data]
    assert check([*args, "--job.dump_folder", str(out)]).startswith("config ok:")
    return tomllib.loads(path.read_text())


@pytest.mark.parametrize(
    "flavor,gpus,gpu,batch", [("13B", 8, "a100-hgx4", 8), ("1B", 1, "a100", 4)]
)
def test_written_toml_passes_check_and_prices_the_same(
    flavor, gpus, gpu, batch, real_data, tmp_path, capsys
):
    """The winner's TOML (and, for 13B, the best pipelined layout's) passes `check
    --nproc N` in process, and `bench model --config` reads back the very plan priced;
    checkpointing is on, every 30 predicted minutes or so."""
    from boost_titan.perf.job_plan import job_plan
    from boost_titan.plan import main

    path = tmp_path / "auto.toml"
    argv = ["--auto", "--flavor", flavor, "--gpus", str(gpus), "--gpu", gpu]
    assert main([*argv, "--global-batch", str(batch), "--write-toml", str(path)]) == 0
    capsys.readouterr()
    result = layout_search.plan_layouts(
        request(flavor=flavor, gpus=gpus, gpu=gpu, global_batch=batch)
    )
    layouts = [result.ranked[0]] + [lay for lay in result.ranked if lay.plan.pp > 1][:1]
    assert flavor != "13B" or layouts[-1].plan.pp == 2
    assert path.read_text() == layout_search.toml_text(result, layouts[0])
    assert f"{layouts[0].step_s:.3f} s per step" in path.read_text().splitlines()[2]
    for i, lay in enumerate(layouts):
        path.write_text(layout_search.toml_text(result, lay))
        checkpoint = _checked(path, gpus, real_data, tmp_path / f"out{i}")["checkpoint"]
        assert checkpoint["enable"] and checkpoint["keep_latest_k"] == 3
        minutes = checkpoint["interval"] * lay.step_s / 60
        assert 27 <= minutes <= 30 or checkpoint["interval"] == layout_search.STEPS, minutes
        assert job_plan(str(path), gpus).plan == lay.plan


def test_planned_toml_one_memory_answer_and_its_own_process_count(tmp_path, capsys):
    """7B on 8 A100s, global batch 8: the pick shards data (TP x DP). `bench model --config`
    on its TOML prints the planner's peak GiB per GPU, with `--nproc 8` and without it (the
    TOML's degrees make the planned count), and `check`'s line prices the same bytes."""
    from boost_titan.bench.__main__ import main as bench
    from boost_titan.config.cli import parse_job_config
    from boost_titan.perf.fits import job_of
    from boost_titan.perf.job_plan import job_plan

    result = layout_search.plan_layouts(request(flavor="7B", gpus=8, global_batch=8))
    lay = result.ranked[0]
    assert lay.dp > 1 and lay.plan.tp > 1, layout_search.describe(lay)
    path = tmp_path / "auto.toml"
    path.write_text(layout_search.toml_text(result, lay))
    assert f"peak {lay.memory_gib:.1f} GiB per GPU" in path.read_text()
    for nproc in (["--nproc", "8"], []):
        command = ["model", "--config", str(path), *nproc, "--gpu", "a100"]
        assert bench(command) == 0
        row = capsys.readouterr().out.splitlines()[-1]
        assert f"  {lay.memory_gib:.1f}  " in row, row  # the mem GiB column
        assert bench([*command, "--json", "-"]) == 0
        (record,) = json.loads(capsys.readouterr().out)
        assert record["memory_bytes_per_rank"]["total"] == lay.memory.total
        job = job_plan(str(path), *([8] if nproc else []))
        assert (job.dp_shard, job.peak_memory()) == (lay.dp, lay.memory)
    parsed = parse_job_config(["--job.config_file", str(path)])
    assert job_of(parsed, 8).peak_memory() == lay.memory


def test_fit_line_says_fits_or_not():
    """`check`'s memory line: the prediction against the usable share of the GPU."""
    from boost_titan.perf.fits import fit_line
    from boost_titan.perf.job_plan import JobPlan

    args = layout.trained_shape("7B", "cola", "btp")
    plan = TrainingLayout(strategy="btp", tp=2, micro_batch=2, microbatches=1)
    job = JobPlan("7B", args, plan, "", (), dp_shard=4)
    peak = job.peak_memory().total / GIB
    roomy = fit_line(job, "h100", 80.0, assumed=False)
    assert f"predicted {peak:.1f} GiB" in roomy and ": fits, " in roomy
    assert "assumed" not in roomy
    tight = fit_line(job, "a100", peak / layout_search.USABLE - 0.5, assumed=True)
    assert "does NOT fit" in tight and "an assumed" in tight
    assert f"by {peak - layout_search.USABLE * (peak / layout_search.USABLE - 0.5):.1f}" in tight


def planner_page_requests() -> list[list[str]]:
    """The `plan --auto` arguments of every request shown in docs/planner.md."""
    text = (ROOT / "docs" / "planner.md").read_text().replace("\\\n", " ")
    found = re.findall(r"python -m boost_titan\.plan (--auto --[^`\n]*)", text)
    requests = []
    for command in found:
        words = shlex.split(command)
        if "--write-toml" in words:  # the page's own path: the test writes its own
            del words[words.index("--write-toml") : words.index("--write-toml") + 2]
        requests.append(words)
    return requests


def test_every_request_on_the_planner_page_writes_a_checked_config(real_data, tmp_path, capsys):
    """Each request shown in docs/planner.md, run with --write-toml: the config passes
    `check` on its GPU count and saves checkpoints."""
    from boost_titan.plan import main

    requests = planner_page_requests()
    assert len(requests) == 16, requests  # the example and the 15 generated tables
    for i, words in enumerate(requests):
        path = tmp_path / f"plan{i}.toml"
        assert main([*words, "--write-toml", str(path)]) == 0, words
        gpus = int(words[words.index("--gpus") + 1])
        config = _checked(path, gpus, real_data, tmp_path / f"out{i}")
        assert config["checkpoint"]["enable"] and config["checkpoint"]["interval"] >= 1, words
    capsys.readouterr()
