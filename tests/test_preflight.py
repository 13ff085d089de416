"""What a job reads is checked before workers start, one job per dump folder, ranks that
agree on the checkpoint, the torchrun relay, and command lines that start fast.

Each bad input ends in one `error:` line, exit status 2 and nothing written (through
`boost_titan.check.main` in this process; `tests/test_bad_inputs.py` runs the command
line). The slow tests launch `run_train.sh`, a worker and gloo ranks.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from distributed import run_on_ranks
from test_cli import DEBUG_TOML, ROOT, assert_one_error, run_module

from boost_titan.check import FINISHED, main
from boost_titan.config.errors import ConfigError
from boost_titan.runtime.dump_lock import LOCK_FILE
from boost_titan.torchrun_relay import relay

ENV = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE", "RANK")}


def save_model_checkpoint(folder: Path, value: float = 1.0, *args: str) -> Path:
    """A DCP checkpoint (`.metadata` + one shard) of the debug.toml job's model (with the
    overrides `args`), every weight filled with `value`."""
    from boost_titan.boost_llama.export_format import model_shapes
    from boost_titan.boost_llama.spec import model_args_for
    from boost_titan.config.cli import parse_job_config

    job = parse_job_config(["--job.config_file", str(DEBUG_TOML), *args])
    state = {
        key: torch.full(shape, value) for key, shape in model_shapes(model_args_for(job)).items()
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return folder


def run_check(capsys, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `boost_titan.check` on debug.toml, 2 processes,
    dump folder `tmp_path/dump`."""
    argv = [
        "--nproc",
        "2",
        "--job.config_file",
        str(DEBUG_TOML),
        "--job.dump_folder",
        str(tmp_path / "dump"),
        *args,
    ]
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error(capsys, tmp_path: Path, *args: str) -> str:
    """The single `error:` line of a check that fails with status 2 and writes nothing."""
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    code, out, err = run_check(capsys, tmp_path, *args)
    lines = err.strip().splitlines()
    assert code == 2 and out == "", (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing written or left
    return lines[0]


# ---- the initial checkpoint ------------------------------------------------------------
def test_corrupt_metadata(capsys, tmp_path):
    step = save_model_checkpoint(tmp_path / "step-3")
    (step / ".metadata").write_bytes(os.urandom(512))
    line = one_error(capsys, tmp_path, "--checkpoint.initial_load_path", str(step))
    assert f"checkpoint.initial_load_path {step}: cannot read its .metadata (" in line
    assert "the checkpoint is damaged, use another step-N folder" in line


def test_truncated_and_missing_shard(capsys, tmp_path):
    step = save_model_checkpoint(tmp_path / "step-3")
    shard = step / "__0_0.distcp"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size // 2])
    line = one_error(capsys, tmp_path, "--checkpoint.initial_load_path", str(step))
    assert f"__0_0.distcp is truncated ({size // 2:,} bytes, its .metadata needs {size:,})" in line
    shard.unlink()
    line = one_error(capsys, tmp_path, "--checkpoint.initial_load_path", str(step))
    assert "__0_0.distcp is missing (its .metadata names it)" in line


def test_initial_checkpoint_of_another_model(capsys, tmp_path):
    """A checkpoint of another arch or rank is one line naming the first differing weight
    (TorchTitan would stop with a traceback on a missing weight, drop an extra one)."""
    step = save_model_checkpoint(tmp_path / "step-3")
    line = one_error(
        capsys, tmp_path, "--checkpoint.initial_load_path", str(step), "--boost.arch", "lax"
    )
    assert (
        f"checkpoint.initial_load_path {step} has layers.1.attention.wk.cross.weight missing"
        in line
    )
    assert line.endswith("train with the model.flavor, [boost] arch and rank it was saved with")
    line = one_error(
        capsys, tmp_path, "--checkpoint.initial_load_path", str(step), "--boost.rank", "32"
    )
    assert "has layers.0.attention.wk.down.weight (64, 256) but the job's model" in line
    assert "expects (32, 256)" in line
    lax = save_model_checkpoint(tmp_path / "lax" / "step-3", 1.0, "--boost.arch", "lax")
    line = one_error(capsys, tmp_path, "--checkpoint.initial_load_path", str(lax))
    assert "has layers.1.attention.wk.cross.weight (64, 64) but" in line
    assert "expects no such weight" in line


def test_whole_initial_checkpoint_passes(capsys, tmp_path):
    step = save_model_checkpoint(tmp_path / "step-3")
    code, out, err = run_check(capsys, tmp_path, "--checkpoint.initial_load_path", str(step))
    assert code == 0 and out.startswith("config ok") and err == "", err
    assert not (tmp_path / "dump").exists()  # check leaves no empty dump folder behind


# ---- the checkpoint a rerun resumes from --------------------------------------------------
def test_damaged_resume_checkpoint(capsys, tmp_path):
    step = save_model_checkpoint(tmp_path / "dump" / "checkpoint" / "step-3")
    (step / ".metadata").write_bytes(b"garbage")
    line = one_error(capsys, tmp_path)
    assert f"the checkpoint to resume from, {step}: cannot read its .metadata" in line
    assert "move that step-N folder away" in line


def test_initial_checkpoint_not_silently_ignored(capsys, tmp_path):
    """A checkpoint folder without a complete checkpoint (a crash before the first save)
    would make TorchTitan skip initial_load_path and start from scratch."""
    step = save_model_checkpoint(tmp_path / "seed" / "step-0")
    (tmp_path / "dump" / "checkpoint" / "step-5").mkdir(parents=True)  # no .metadata
    line = one_error(capsys, tmp_path, "--checkpoint.initial_load_path", str(step))
    ignored = f"checkpoint.initial_load_path {step} would be ignored: {tmp_path}/dump/checkpoint"
    assert f"{ignored} exists without a complete checkpoint" in line
    assert line.endswith("delete that folder to start from the initial checkpoint")


def test_finished_job_is_reported_before_launch(capsys, tmp_path):
    """A dump folder at training.steps: `nothing to train`, status FINISHED; one step more
    passes and says where it resumes."""
    save_model_checkpoint(tmp_path / "dump" / "checkpoint" / "step-3")
    code, out, err = run_check(capsys, tmp_path, "--training.steps", "3")
    assert code == FINISHED and err == "", err
    assert out.strip() == (
        f"nothing to train: already at step 3 ({tmp_path}/dump/checkpoint/step-3) and "
        "training.steps is 3; raise --training.steps to continue, or set --job.dump_folder "
        "to a new folder to start over"
    )
    code, out, _ = run_check(capsys, tmp_path, "--training.steps", "4")
    assert code == 0 and "4 steps, resumes from step 3" in out


# ---- datasets decoded as the loader will ---------------------------------------------------
UNDECODABLE = {
    "x.jsonl": "line 1 is not JSON (",
    "corpus.txt": "is not UTF-8 text (byte 0x",
    "docs.parquet": "is not a readable parquet file (",
}


@pytest.mark.parametrize("name", list(UNDECODABLE))
def test_undecodable_dataset_file(capsys, tmp_path, name):
    data = tmp_path / "data"
    data.mkdir()
    (data / "good.txt").write_text("a paragraph of text\n")
    (data / name).write_bytes(b"\x8f\xff" + os.urandom(4096))
    line = one_error(capsys, tmp_path, "--training.dataset_path", str(data))
    assert f"training.dataset_path: {data / name} {UNDECODABLE[name]}" in line
    assert line.endswith(("fix the file or remove it", "convert it to UTF-8 or remove it"))


# ---- messages that name the field and the fix ---------------------------------------------
MESSAGES = {
    "seq_len 0": (
        ["--training.seq_len", "0"],
        "training.seq_len 0 must be >= 1 (tokens per sequence); set --training.seq_len "
        "to 1 or more",
    ),
    "local batch 0": (
        ["--training.local_batch_size", "0"],
        "training.local_batch_size 0 must be >= 1",
    ),
    "steps -1": (["--training.steps", "-1"], "training.steps -1 must be >= 0"),
    "flag given true": (
        ["--boost.lowrank_ac", "true"],
        "--boost.lowrank_ac is a flag and takes no value ('true' given); write "
        "--boost.lowrank_ac to turn it on, --boost.no_lowrank_ac to turn it off",
    ),
    "flag given =false": (
        ["--checkpoint.enable=false"],
        "--checkpoint.enable is a flag and takes no value ('false' given)",
    ),
}


@pytest.mark.parametrize("case", list(MESSAGES))
def test_message_names_field_and_fix(capsys, tmp_path, case):
    args, expected = MESSAGES[case]
    assert expected in one_error(capsys, tmp_path, *args)


# ---- one job per dump folder -------------------------------------------------------------
HOLDER = (
    "import sys, time\n"
    "from boost_titan.runtime.dump_lock import DumpFolderLock\n"
    "DumpFolderLock(sys.argv[1]).acquire()\n"
    "print('locked', flush=True)\n"
    "time.sleep(600)\n"
)


def hold_lock(folder: Path) -> subprocess.Popen:
    """A process that holds `folder`'s lock until killed."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV | {"PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_second_job_refused_and_stale_lock_ignored(capsys, tmp_path):
    """A job holding the dump folder makes a second one fail with one line naming its pid
    and host; once the holder is SIGKILLed, the folder is free (the kernel released the
    lock; the file with the dead holder's pid stays)."""
    import socket

    dump = tmp_path / "dump"
    holder = hold_lock(dump)
    try:
        line = one_error(capsys, tmp_path)
        holder_info = f"(pid {holder.pid} on {socket.gethostname()}, since "
        assert f"job.dump_folder {dump} is in use by another job {holder_info}" in line
        assert line.endswith("wait for it to finish, or set --job.dump_folder to another folder")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert f'"pid": {holder.pid}' in (dump / LOCK_FILE).read_text()
    code, out, err = run_check(capsys, tmp_path)
    assert code == 0 and out.startswith("config ok"), err


@pytest.mark.slow
def test_worker_refuses_a_held_dump_folder(tmp_path):
    """A worker started by hand (no check) on a held folder: one line, exit 2, and it wrote
    nothing there."""
    dump = tmp_path / "dump"
    holder = hold_lock(dump)
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "boost_titan.train",
                "--job.config_file",
                str(DEBUG_TOML),
                "--job.dump_folder",
                str(dump),
            ],
            cwd=ROOT,
            env=ENV | {"RANK": "0"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert_one_error(result, f"in use by another job (pid {holder.pid} on ")
    assert result.returncode == 2
    assert os.listdir(dump) == [LOCK_FILE]


# ---- ranks agree on the checkpoint ----------------------------------------------------------
def _load_with_own_view(rank: int, world_size: int, root: str) -> dict[str, object]:
    """Each rank resumes from its own copy of the dump folder (`root/<scenario>/rank<r>`), as
    if the ranks saw one folder differently; returns the loaded weight or the error."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config import Checkpoint

    from boost_titan.runtime.resume import agree_on_checkpoint

    model = torch.nn.Module()  # loads one tensor of the debug-model checkpoints: norm.weight
    model.norm = torch.nn.RMSNorm(256)
    results: dict[str, object] = {}
    for scenario in ("rank1-sees-newer", "rank1-misses-newest"):
        config = Checkpoint(
            enable=True,
            keep_latest_k=0,
            exclude_from_loading=["optimizer", "lr_scheduler", "dataloader"],
        )
        manager = CheckpointManager(
            dataloader=None,
            model_parts=[model],
            optimizers=None,
            lr_schedulers=None,
            states={},
            checkpoint_config=config,
            sd_adapter=None,
            base_folder=os.path.join(root, scenario, f"rank{rank}"),
        )
        try:
            agree_on_checkpoint(manager, load_step=-1)
            manager.load()
            results[scenario] = model.norm.weight[0].item()
        except ConfigError as e:
            results[scenario] = str(e)
    return results


@pytest.mark.slow
def test_ranks_load_the_checkpoint_rank0_picks(tmp_path):
    """Rank 1 sees a newer step-9 (another job wrote it): both ranks load rank 0's step-6.
    Rank 1 misses rank 0's newest step-9: both ranks stop with the same one-line error."""
    steps = {
        ("rank1-sees-newer", 0): (3, 6),
        ("rank1-sees-newer", 1): (3, 6, 9),
        ("rank1-misses-newest", 0): (3, 6, 9),
        ("rank1-misses-newest", 1): (3, 6),
    }
    for (scenario, rank), saved in steps.items():
        for step in saved:
            folder = tmp_path / scenario / f"rank{rank}" / "checkpoint" / f"step-{step}"
            save_model_checkpoint(folder, step)
    results = run_on_ranks(_load_with_own_view, 2, root=str(tmp_path))
    assert [r["rank1-sees-newer"] for r in results] == [6.0, 6.0]
    errors = [r["rank1-misses-newest"] for r in results]
    assert errors[0] == errors[1] and "\n" not in errors[0], errors
    assert errors[0].startswith(
        f"rank 1 does not see a complete {tmp_path}/rank1-misses-newest/rank1/checkpoint/step-9 "
        f"(rank 0 resumes from {tmp_path}/rank1-misses-newest/rank0/checkpoint/step-9)"
    ), errors[0]


# ---- run_train.sh: a worker's error ends the output ------------------------------------------
FAILED_RUN = """\
[rank0]:[titan] - root - INFO - Starting job
[rank0]:error: cannot read the text files under /data (bad byte); fix or remove them
[rank0]:[titan] - root - INFO - Loading tokenizer
E1124 api.py:1002] failed (exitcode: 2) local_rank: 0 (pid: 22750)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
Failures:
[1]:
  exitcode  : 2 (pid: 22751)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 2 (pid: 22750)
============================================================
"""


def test_relay_ends_on_the_worker_error():
    out = io.StringIO()
    assert relay(io.StringIO(FAILED_RUN), out) == 2
    lines = out.getvalue().splitlines()
    error = "error: cannot read the text files under /data (bad byte); fix or remove them"
    assert lines[-1] == error
    assert lines[:-1] == FAILED_RUN.splitlines()[:3]  # worker lines as they came, no report


def test_relay_keeps_other_output():
    """A failure without a worker `error:` keeps torchrun's report; an `error:` line in a
    run that did not fail (a restart that recovered) changes nothing."""
    crashed = FAILED_RUN.replace("[rank0]:error:", "[rank0]:Exception:")
    out = io.StringIO()
    assert relay(io.StringIO(crashed), out) is None and out.getvalue() == crashed
    recovered = FAILED_RUN.split("Traceback")[0] + "[rank0]:Summary: ran 10 steps\n"
    out = io.StringIO()
    assert relay(io.StringIO(recovered), out) is None and out.getvalue() == recovered


def test_relay_command_returns_the_worker_status():
    """`python -m boost_titan.torchrun_relay CMD`: CMD's output relayed, the worker's exit
    status when its error replaced the report, else CMD's own."""
    printer = [sys.executable, "-c", f"import sys; sys.stdout.write({FAILED_RUN!r}); sys.exit(1)"]
    result = run_module("boost_titan.torchrun_relay", *printer)
    assert result.returncode == 2
    assert result.stdout.splitlines()[-1].startswith("error: cannot read")
    result = run_module("boost_titan.torchrun_relay", sys.executable, "-c", "print('hi'); exit(5)")
    assert (result.returncode, result.stdout) == (5, "hi\n")


@pytest.mark.slow
def test_run_train_ends_on_a_worker_error(tmp_path):
    """A text file whose damage lies past check's sample: check passes, the workers' loader
    fails, and run_train.sh ends with their one-line error, exit 2, no torchrun report."""
    data = tmp_path / "data"
    data.mkdir()
    good = ("def f(x):\n    return x + 1\n\n" * 100_000).encode()[: 2 << 20]
    (data / "corpus.txt").write_bytes(good + b"\x8f\xff" * 64)
    env = ENV | {"NGPU": "2", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            "./run_train.sh",
            "--job.dump_folder",
            str(tmp_path / "dump"),
            "--training.dataset_path",
            str(data),
            "--training.steps",
            "1",
            "--training.seq_len",
            "32",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    lines = output.strip().splitlines()
    assert result.returncode == 2, output[-3000:]
    assert lines[0].startswith("config ok"), output[-3000:]
    assert lines[-1].startswith(f"error: cannot read the text files under {data} ("), output[-3000:]
    assert "Traceback" not in output and "ChildFailedError" not in output
    assert not (tmp_path / "dump" / "checkpoint").exists()


@pytest.mark.slow
def test_run_train_skips_a_finished_job(tmp_path):
    """run_train.sh on a dump folder at training.steps: check's line, exit 0, no worker."""
    save_model_checkpoint(tmp_path / "dump" / "checkpoint" / "step-3")
    result = subprocess.run(
        ["./run_train.sh", "--job.dump_folder", str(tmp_path / "dump"), "--training.steps", "3"],
        cwd=ROOT,
        env=ENV | {"NGPU": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("nothing to train: already at step 3"), result.stdout
    assert "[rank" not in result.stdout + result.stderr


# ---- command lines start fast ------------------------------------------------------------------
FAST_COMMANDS = {
    "bench --help": ["boost_titan.bench", "--help"],
    "bench model": ["boost_titan.bench", "model", "--flavor", "1B", "--dtype", "bfloat16"],
    "export --help": ["boost_titan.export", "--help"],
    "check --help": ["boost_titan.check", "--help"],
    "plan --help": ["boost_titan.plan", "--help"],
}


@pytest.mark.parametrize("name", list(FAST_COMMANDS))
def test_command_imports_no_torch(name):
    """These commands import neither torch nor torchtitan (`scripts/time_cli.py` times them)."""
    module, *args = FAST_COMMANDS[name]
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{module!r}, *{args!r}]\n"
        "try:\n"
        f"    runpy.run_module({module!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'torchtitan'})\n"
        "print('imported:', heavy, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=ENV | {"PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "printed nothing"
    assert result.stderr.strip().splitlines()[-1] == "imported: []", result.stderr
