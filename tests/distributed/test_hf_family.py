"""A Hugging Face causal LM as a model family (`--model.name hf`): a tiny Llama saved to a
folder (config.json, model.safetensors, tokenizer.json; built from a config, every weight
random, nothing downloaded) converted to CoLA (SVD initialisation) and trained by
`boost_titan.train` under BTP at TP 2, as `run_train.sh` runs it (`check` in this process,
then torchrun): 4 steps with a checkpoint every step and validation at steps 2 and 4; then
its step-2 checkpoint resumed in a new dump folder with the same `training.steps`, whose
torchrun gets SIGTERM during step 3 (a preemption: it stops with the step's checkpoint);
then the step-4 checkpoint exported (`python -m boost_titan.export --hf-model`) and loaded
back by transformers (`load_hf`), its logits the trainer's model's; a resume at another
rank and an export without its arch are one line each. Two launches in all, shared by the
tests.

`tests/unit/test_hf_family.py`: the model built as the trainer builds it starts from the
folder's converted weights; the refused jobs; LaX."""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from boost_titan.check import main as check_main
from boost_titan.export import main as export_main
from boost_titan.job.launch import train_command
from boost_titan.runtime.stopping import STOPPED, stopped_line
from tests.helpers import DEBUG_TOML, ROOT
from tests.helpers.hf_models import write_pretrained

STEPS, SEQ_LEN, BATCH = 4, 64, 4
PREEMPTED = 3
"""The step during which the resumed run's torchrun gets SIGTERM (the `sigterm` fault)."""


def hf_args(folder: Path) -> list[str]:
    """The hf job on debug.toml (CoLA, BTP TP 2): a checkpoint every 2 steps, all kept,
    one validation batch every 2 steps."""
    return [
        *("--model.name", "hf", "--model.hf_assets_path", str(folder), "--boost.arch", "cola"),
        *("--training.steps", str(STEPS), "--training.seq_len", str(SEQ_LEN)),
        *("--training.local_batch_size", str(BATCH), "--lr_scheduler.warmup_steps", "2"),
        *("--validation.freq", "2", "--validation.steps", "1"),
        *("--validation.seq_len", str(SEQ_LEN), "--validation.local_batch_size", str(BATCH)),
        *("--checkpoint.interval", "2", "--checkpoint.keep_latest_k", "0"),
        *("--metrics.log_freq", "1", "--metrics.disable_color_printing"),
    ]


def _train(folder: Path, args: list[str], status: int = 0, **fault: str) -> str:
    """Train into `folder` under torchrun (ours, `boost_titan.torchrun`, as run_train.sh
    launches it, in its own process group: the `sigterm` fault signals that group); the run
    must exit `status`. `fault`: `runtime.restarts`' BOOST_TITAN_FAULT_* settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update({f"BOOST_TITAN_FAULT_{key.upper()}": value for key, value in fault.items()})
    command = train_command(2, DEBUG_TOML, folder, args, launcher_args=("--role", "rank"))
    command[command.index("torch.distributed.run")] = "boost_titan.torchrun"
    result = subprocess.run(
        command,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    output = result.stdout + result.stderr
    assert result.returncode == status, output[-4000:]
    return output


def _printed(main, argv: list[str]) -> str:
    """What a command's `main` prints (it returns: no error)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    return out.getvalue()


@dataclass
class HfRuns:
    pretrained: Path
    args: list[str]
    checked: str
    """`check`'s output for the first run."""
    rows: dict[str, list[dict]]
    """losses.jsonl training rows: "uninterrupted" (steps 1-4), "resumed" (step 3, then
    preempted)."""
    validation: list[dict]
    """The uninterrupted run's validation rows (steps 2, 4)."""
    resumed_output: str
    export: Path
    full: Path
    """The uninterrupted run's dump folder (a checkpoint every step)."""
    resumed: Path
    """The resumed run's dump folder."""


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory) -> HfRuns:
    from boost_titan.runtime.run_log import read_log

    root = tmp_path_factory.mktemp("hf")
    pretrained = write_pretrained(root / "pretrained")
    args = hf_args(pretrained)
    full, resumed = root / "full", root / "resumed"
    check_argv = ["--nproc", "2", "--job.config_file", str(DEBUG_TOML)]
    checked = _printed(check_main, [*check_argv, "--job.dump_folder", str(full), *args])
    _train(full, [*args, "--checkpoint.interval", "1"])
    shutil.copytree(full / "checkpoint" / "step-2", resumed / "checkpoint" / "step-2")
    resumed_output = _train(resumed, args, STOPPED, step=str(PREEMPTED), point="sigterm")
    export = root / "export"
    _printed(
        export_main,
        [
            *("--checkpoint", str(full / "checkpoint" / "step-4"), "--out", str(export)),
            *("--hf-model", str(pretrained), "--arch", "cola"),
        ],
    )
    rows, validation = read_log(str(full / "losses.jsonl"))
    resumed_rows, _ = read_log(str(resumed / "losses.jsonl"))
    return HfRuns(
        pretrained,
        args,
        checked,
        {"uninterrupted": rows, "resumed": resumed_rows},
        validation,
        resumed_output,
        export,
        full,
        resumed,
    )


def test_hf_trains_resumes_and_stops_exactly(hf_runs):
    """`check` accepts the job (the folder's model, CoLA, BTP); the run learns; resumed
    from the step-2 checkpoint, step 3 equals the uninterrupted run's bit for bit (same
    processes, same layout: a lost data position, LR schedule, optimizer state or weight
    moves it); SIGTERM during step 3 (a scheduler's preemption) ends that run after the
    step with the stop line and exit 75, its step-3 checkpoint (`[checkpoint] interval` 2:
    saved by the stop) holding the uninterrupted run's step-3 weights, every tensor equal."""
    from boost_titan.boost_llama.export_format import load_model_state

    assert (
        "config ok: hf " in hf_runs.checked and "cola, tp_strategy auto -> btp" in hf_runs.checked
    )
    uninterrupted = {row["step"]: row for row in hf_runs.rows["uninterrupted"]}
    resumed = {row["step"]: row for row in hf_runs.rows["resumed"]}
    assert sorted(uninterrupted) == [1, 2, 3, 4] and sorted(resumed) == [PREEMPTED]
    assert "Training starts at step 3" in hf_runs.resumed_output
    for step, row in resumed.items():
        for key in ("loss", "grad_norm"):
            assert math.isfinite(row[key]) and row[key] == uninterrupted[step][key], (step, key)
    assert uninterrupted[4]["loss"] < uninterrupted[1]["loss"]
    saved = hf_runs.resumed / "checkpoint" / f"step-{PREEMPTED}"
    last = hf_runs.resumed_output.strip().splitlines()[-1].removeprefix("[rank0]:")
    assert last == stopped_line("SIGTERM", PREEMPTED, str(saved)), last
    stopped = load_model_state(str(saved))
    reference = load_model_state(str(hf_runs.full / "checkpoint" / f"step-{PREEMPTED}"))
    assert stopped.keys() == reference.keys()
    for key, tensor in reference.items():
        assert torch.equal(stopped[key], tensor), key


LOGITS_ULPS = 4
"""fp32 rounding: the logits may differ by 4 fp32 ulps of the largest logit (4.6e-7 here;
measured: bit for bit). One weight of the export scaled by 1 + 1e-4 moves them by 1e-6."""


def trainer_logits(hf_runs, step: int, ids: torch.Tensor) -> torch.Tensor:
    """The logits of the trainer's model at `step`: the family's model (`build_hf_model`, as
    the trainer builds it) holding the step's checkpoint, on one process."""
    from boost_titan.boost_llama.export_format import load_model_state
    from boost_titan.config.cli import parse_job_config
    from boost_titan.hf_family.model import build_hf_model
    from boost_titan.hf_family.spec import job_args

    job = parse_job_config(["--job.config_file", str(DEBUG_TOML), *hf_runs.args])
    model = build_hf_model(job_args(job)).eval()
    state = load_model_state(str(hf_runs.full / "checkpoint" / f"step-{step}"))
    model.load_state_dict(state)
    with torch.no_grad():
        return model(ids)


def test_hf_export_reloads_in_transformers(hf_runs):
    """The step-4 export is a Hugging Face folder transformers loads (`load_hf`: config,
    CoLA pairs, weights; its tokenizer with AutoTokenizer): on the validation batch its
    logits equal the trainer's model's at step 4 (`trainer_logits`) within fp32 rounding
    (`LOGITS_ULPS`), and its held-out loss the one the TP 2 run logged at step 4 (rel
    1e-5)."""
    from transformers import AutoTokenizer

    from boost_titan.config.cli import parse_job_config
    from boost_titan.data import build_tokenizer
    from boost_titan.data.held_out import build_validation_batches, validation_data
    from boost_titan.parallelize import load_hf

    export = hf_runs.export
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(export))
    assert AutoTokenizer.from_pretrained(export).bos_token == "<|bos|>"
    model = load_hf(export).eval()
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "LowRankLinear"
    job = parse_job_config(["--job.config_file", str(DEBUG_TOML), *hf_runs.args])
    batches = build_validation_batches(
        validation_data(job), build_tokenizer(job), SEQ_LEN, BATCH, steps=1
    )
    total, tokens = 0.0, 0
    for input_dict, labels in batches:
        with torch.no_grad():
            logits = model(input_dict["input"]).logits
        trained = trainer_logits(hf_runs, STEPS, input_dict["input"])
        ulp = torch.finfo(torch.float32).eps * trained.abs().max().item()
        torch.testing.assert_close(logits, trained, rtol=0, atol=LOGITS_ULPS * ulp)
        total += torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), reduction="sum"
        ).item()
        tokens += int((labels != -100).sum())
    (trained,) = [row for row in hf_runs.validation if row["step"] == STEPS]
    assert tokens == trained["validation_tokens"]
    assert math.isclose(total / tokens, trained["validation_loss"], rel_tol=1e-5), (
        total / tokens,
        trained,
    )


def test_hf_checkpoint_mismatches_are_one_line(hf_runs, tmp_path, capsys):
    """Through the family's hooks `check` names the hf model a checkpoint does not hold
    (resuming the run at another rank), and `export --hf-model` asks for the arch that
    low-rank pairs cannot tell (svd or cola); one `error:` line each, exit 2."""
    argv = ["--nproc", "2", "--job.config_file", str(DEBUG_TOML)]
    argv += ["--job.dump_folder", str(hf_runs.full), *hf_runs.args, "--boost.rank", "8"]
    step4 = str(hf_runs.full / "checkpoint" / "step-4")
    export = ["--checkpoint", step4, "--out", str(tmp_path / "out"), "--hf-model"]
    export.append(str(hf_runs.pretrained))
    cases = [
        (
            check_main,
            argv,
            [
                "mlp.down_proj.down.weight (16, 96)",
                "expects (8, 96)",
                "arch cola, rank 8",
                "and rank it was saved with",
            ],
        ),
        (export_main, export, ["fit --arch svd or cola", "pass the [boost] arch"]),
    ]
    for main, args, fragments in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        out, err = capsys.readouterr()
        assert exit_info.value.code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert err.startswith("error: ") and all(f in err for f in fragments), err
    assert not (tmp_path / "out").exists()
