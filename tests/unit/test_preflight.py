"""What a job reads is checked before workers start, one job per dump folder, the torchrun
relay, and command lines that start fast.

Each bad input ends in one `error:` line, exit status 2 and nothing written (through
`boost_titan.check.main` in this process; `tests/unit/test_bad_inputs.py` runs the command
line). `tests/distributed/test_preflight.py` launches a worker, gloo ranks and
`run_train.sh`.
"""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from boost_titan.check import FINISHED, main
from boost_titan.runtime.dump_lock import LOCK_FILE
from boost_titan.torchrun_relay import relay
from tests.helpers import DEBUG_TOML, ROOT
from tests.helpers.checkpoints import save_model_checkpoint
from tests.helpers.commands import (
    assert_one_error,
    check_each,
    clean_env,
    hold_lock,
    run_module,
)
from tests.helpers.corpus import write_tiktoken


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
    # seeded: a few random files in 10^4 happen to unpickle into an unsafe global instead
    (step / ".metadata").write_bytes(random.Random(3).randbytes(512))
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
    assert line.endswith(
        "train with the model.flavor, [boost] arch and rank, and tokenizer it was saved with"
    )
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


def test_resume_of_another_model(capsys, tmp_path):
    """A dump folder holding a CoLA checkpoint, resumed by a LaX, SVD-rank-32 or other-vocab
    job: one line before any worker starts (TorchTitan would stop with a traceback or drop
    the extra weights); the CoLA job itself resumes."""
    step = save_model_checkpoint(tmp_path / "dump" / "checkpoint" / "step-3")
    where = f"the checkpoint to resume from, {step}, has "
    fix = "set --job.dump_folder to a new folder for this model, or train with the model.flavor"
    line = one_error(capsys, tmp_path, "--boost.arch", "lax")
    assert line.startswith(f"error: {where}layers.1.attention.wk.cross.weight missing")
    assert "(debug, arch lax, rank 64, vocab 4096)" in line and fix in line
    line = one_error(capsys, tmp_path, "--boost.arch", "svd", "--boost.rank", "32")
    assert "(64, 256) but the job's model (debug, arch svd, rank 32, vocab 4096)" in line
    tokenizer = write_tiktoken(tmp_path / "tokenizer" / "tokenizer.model").parent
    line = one_error(capsys, tmp_path, "--model.hf_assets_path", str(tokenizer))
    assert "output.weight (4096, 256) but the job's model (debug, arch cola" in line
    assert "rank 64, vocab 262) expects (262, 256)" in line
    code, out, _ = run_check(capsys, tmp_path)
    assert code == 0 and "resumes from step 3" in out


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


# ---- the torchrun relay: a worker's error ends the output -----------------------------------
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


def test_relay_help_and_a_missing_launcher():
    result = run_module("boost_titan.torchrun_relay", "--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: python -m boost_titan")
    result = run_module("boost_titan.torchrun_relay", "no-such-launcher", "--nproc_per_node=2")
    assert_one_error(result, "cannot run 'no-such-launcher' (No such file or directory)")


def test_example_without_torchrun_names_the_command():
    """(`hf_llama` joins its job through the same `examples.start_process_group`.)"""
    result = run_module("boost_titan.examples.own_model")
    fix = "run it as torchrun --nproc_per_node=2 -m boost_titan.examples.own_model"
    assert_one_error(result, "no torchrun job to join", fix)


def test_hf_commands_without_transformers_name_the_extra(tmp_path):
    """Simulated absence (the venv has transformers): one line naming the extra, exit 2."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['transformers'] = None\n")
    env = clean_env() | {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    for module in ("boost_titan.examples.hf_llama", "boost_titan.hf_refusals"):
        result = subprocess.run(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert_one_error(result, "needs the transformers package", 'pip install -e ".[hf]"')
        assert result.returncode == 2


def test_config_naming_a_module_is_refused_before_it_runs(tmp_path, monkeypatch):
    """`check` and the worker refuse a module to import, naming it, and never import it;
    `--boost.allow_custom_import` on the command line lets it through (then `check` imports
    custom_import as every worker does: a TrainSpec it registers is looked up), the same key
    in the TOML does not."""
    marker = tmp_path / "ran"
    monkeypatch.setenv("BOOST_TITAN_TEST_PAYLOAD", str(marker))
    toml = tmp_path / "job.toml"
    payload = "tests.helpers.payload"
    toml.write_text(f'{DEBUG_TOML.read_text()}\n[experimental]\ncustom_import = "{payload}"\n')
    allows_itself = tmp_path / "allows_itself.toml"
    allows_itself.write_text(
        f'[boost]\nallow_custom_import = true\n[experimental]\ncustom_import = "{payload}"\n'
    )
    dump = ["--job.dump_folder", str(tmp_path / "dump")]
    refused, config_module, self_allowed = check_each(
        [
            ["--job.config_file", str(toml), *dump],
            ["--job.config_file", str(DEBUG_TOML), *dump, "--job.custom_config_module", payload],
            ["--job.config_file", str(allows_itself), *dump],
        ],
        tmp_path,
    )
    assert_one_error(refused, f"experimental.custom_import = '{payload}'", f"module {payload}")
    assert_one_error(config_module, f"job.custom_config_module = '{payload}'")
    assert_one_error(self_allowed, f"experimental.custom_import = '{payload}'")
    worker = run_module("boost_titan.train", "--job.config_file", str(toml), *dump)
    assert_one_error(worker, f"experimental.custom_import = '{payload}'")
    assert worker.returncode == 2 and not marker.exists()
    (allowed,) = check_each(
        [["--job.config_file", str(toml), *dump, "--boost.allow_custom_import"]], tmp_path
    )
    assert allowed.returncode == 0 and allowed.stdout.startswith("config ok"), allowed.stdout
    assert marker.read_text() == "ran"


def test_worker_refuses_degrees_its_ranks_cannot_hold(tmp_path):
    """A worker started without `check` (debug.toml's TP 2 on 1 process, as `torchrun
    --nproc_per_node=1` would start it): `check`'s line, exit 2, before the dump folder or
    TorchTitan's assertion in `ParallelDims` (a traceback)."""
    dump = tmp_path / "dump"
    worker = run_module(
        "boost_titan.train", "--job.config_file", str(DEBUG_TOML), "--job.dump_folder", str(dump)
    )
    assert_one_error(worker, "1 process cannot hold tp 2", "--parallelism.tensor_parallel_degree 1")
    assert worker.returncode == 2 and not dump.exists()


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
        env=clean_env() | {"PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "printed nothing"
    assert result.stderr.strip().splitlines()[-1] == "imported: []", result.stderr
