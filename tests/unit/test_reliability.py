"""Crash recovery's pieces in one process: the shared-store warning, which checkpoints are
incomplete, where a test fault fires, the stop flags and line of a preemption, the launchers
that pass signals on, and the non-finite guard's decisions
(`tests/distributed/test_reliability.py`: runs that are interrupted, crash or are repeated
reproduce an uninterrupted one)."""

from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from boost_titan import torchrun
from boost_titan.checkpoint.files import latest_checkpoint, save_failure
from boost_titan.config.errors import ConfigError
from boost_titan.processes.teardown import CLOSED_KEY, end_process_groups
from boost_titan.runtime.nonfinite import NonFiniteGuard, RankView, blame, nonfinite
from boost_titan.runtime.restarts import Fault, incomplete_checkpoints, shared_store_warning
from boost_titan.runtime.saves import SaveWatch
from boost_titan.runtime.stopping import (
    STOP_LINE,
    STOP_SIGNALS,
    STOPPED,
    StopRequest,
    end_if_stopped_before,
    finished_line,
    record_stop,
    stopped_before,
    stopped_line,
)
from boost_titan.torchrun_relay import relay
from tests.helpers import ROOT


def test_shared_store_warning_only_with_restarts_over_the_agent_store():
    shared = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "1"}
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in shared_store_warning(shared)
    assert shared_store_warning(shared | {"TORCHELASTIC_MAX_RESTARTS": "0"}) is None
    assert shared_store_warning(shared | {"TORCHELASTIC_USE_AGENT_STORE": "False"}) is None
    assert shared_store_warning({}) is None


def test_incomplete_checkpoints_are_the_newer_folders_without_metadata(tmp_path):
    for step, complete in ((2, False), (3, True), (6, False), (9, False)):
        (tmp_path / f"step-{step}").mkdir()
        if complete:
            (tmp_path / f"step-{step}" / ".metadata").write_bytes(b"")
    newer = [str(tmp_path / "step-6"), str(tmp_path / "step-9")]
    assert incomplete_checkpoints(str(tmp_path)) == newer
    assert incomplete_checkpoints(str(tmp_path / "missing")) == []


def test_fault_only_on_its_rank_in_the_first_attempt():
    env = {"BOOST_TITAN_FAULT_STEP": "5"}
    assert Fault.from_env(rank=0, world_size=2, env=env) is None  # default: the last rank
    fault = Fault.from_env(rank=1, world_size=2, env=env)
    assert (fault.steps, fault.point) == ((5,), "step")
    restarted = env | {"TORCHELASTIC_RESTART_COUNT": "1"}
    assert Fault.from_env(rank=1, world_size=2, env=restarted) is None
    assert Fault.from_env(rank=1, world_size=2, env={}) is None
    with pytest.raises(ConfigError, match="integers"):
        Fault.from_env(rank=1, world_size=2, env={"BOOST_TITAN_FAULT_STEP": "five"})
    with pytest.raises(ConfigError, match="one of step, save, nan, inf"):
        Fault.from_env(rank=1, world_size=2, env=env | {"BOOST_TITAN_FAULT_POINT": "later"})


# ---- preemption: signal flags, agreement, the stop line, the launchers ----------------------
def test_first_stop_signal_is_kept_and_flags_agree_on_it():
    stop = StopRequest()
    assert stop.flags() == [0.0, 0.0, 0.0] and stop.reason([0.0, 0.0, 0.0]) is None
    stop.on_signal(signal.SIGUSR1)
    stop.on_signal(signal.SIGTERM)  # a second signal during the stop changes nothing
    assert stop.signal == "SIGUSR1" and stop.flags() == [0.0, 1.0, 0.0]
    # summed over ranks: the signal most ranks got first, SIGTERM on a tie
    assert stop.reason([1.0, 2.0, 0.0]) == "SIGUSR1"
    assert stop.reason([1.0, 1.0, 1.0]) == "SIGTERM"


def test_time_budget_runs_out_on_the_clock():
    now = [100.0]
    stop = StopRequest(budget_minutes=2, clock=lambda: now[0])
    assert stop.flags() == [0.0, 0.0, 0.0]
    now[0] += 120
    assert stop.flags() == [0.0, 0.0, 1.0]
    assert stop.reason([0.0, 0.0, 1.0]) == "time budget (2 min)"
    assert StopRequest(0, clock=lambda: 1e9).flags() == [0.0, 0.0, 0.0]  # 0: no budget


def test_installed_handlers_set_the_flag_and_let_the_process_run():
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        stop = StopRequest()
        stop.install()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal == "SIGTERM"
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_stop_line():
    line = stopped_line("SIGTERM", 25, "/x/checkpoint/step-25")
    assert line == (
        "stopped by SIGTERM at step 25; checkpoint saved (/x/checkpoint/step-25); rerun to continue"
    )
    assert STOP_LINE.match(line) and STOP_LINE.match(stopped_line("time budget (1 min)", 3, None))


STOPPED_RUN = """\
[rank0]:[titan] - root - INFO - step: 24 loss: 7.1
W1125 api.py:753] Received 15 death signal, shutting down workers
[rank0]:stopped by SIGTERM at step 25; checkpoint saved (/x/step-25); rerun to continue
[rank0]:[titan] - root - INFO - Process group destroyed
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15
"""


def test_relay_ends_a_stopped_run_on_its_line_with_status_75():
    out = io.StringIO()
    assert relay(io.StringIO(STOPPED_RUN), out) == STOPPED == 75
    lines = out.getvalue().splitlines()
    assert (
        lines[-1]
        == "stopped by SIGTERM at step 25; checkpoint saved (/x/step-25); rerun to continue"
    )
    assert "Traceback" not in out.getvalue()
    assert (
        relay(io.StringIO(STOPPED_RUN.replace("stopped by", "stopping by")), io.StringIO()) is None
    )


def test_relay_ends_a_run_signalled_in_its_last_step_on_its_line_with_status_0():
    line = finished_line("SIGTERM", 10, "/x/step-10")
    assert line == (
        "SIGTERM during the last step, 10; training is complete, checkpoint saved (/x/step-10)"
    )
    run = STOPPED_RUN.replace(
        "stopped by SIGTERM at step 25; checkpoint saved (/x/step-25); rerun to continue", line
    )
    out = io.StringIO()
    assert relay(io.StringIO(run), out) == 0
    assert out.getvalue().splitlines()[-1] == line and "Traceback" not in out.getvalue()


def test_torchrun_exit_status_of_stopped_workers():
    assert torchrun.exit_status([STOPPED, STOPPED]) == STOPPED
    assert torchrun.exit_status([STOPPED, 0]) == STOPPED  # a rank that ended before the stop
    assert torchrun.exit_status([0, 0]) == 0  # a signal during the last step
    for failed in ([STOPPED, 1], [STOPPED, -15], [2], [], [STOPPED, None]):
        assert torchrun.exit_status(failed) is None, failed


def _failure(tmp_path: Path, rank: int, exitcode: int) -> ProcessFailure:
    return ProcessFailure(rank, 100 + rank, exitcode, str(tmp_path / f"none{rank}.json"))


def test_torchrun_ends_a_stopped_group_with_75_and_no_restart(monkeypatch, tmp_path):
    """A group whose workers exited STOPPED leaves the agent no restart, and
    `python -m boost_titan.torchrun` exits STOPPED instead of raising ChildFailedError;
    any other failure is torchrun's own."""
    agent = SimpleNamespace(_remaining_restarts=3)
    stopped = RunResult(WorkerState.FAILED, failures={0: _failure(tmp_path, 0, STOPPED)})
    monkeypatch.setattr(torchrun, "_monitor_workers", lambda self, group: stopped)
    assert torchrun._monitor_stopped_as_final(agent, None) is stopped
    assert agent._remaining_restarts == 0
    crashed = RunResult(WorkerState.FAILED, failures={0: _failure(tmp_path, 0, -9)})
    agent._remaining_restarts = 3
    monkeypatch.setattr(torchrun, "_monitor_workers", lambda self, group: crashed)
    torchrun._monitor_stopped_as_final(agent, None)
    assert agent._remaining_restarts == 3  # a crash is restarted

    def failing(*codes):
        failures = {r: _failure(tmp_path, r, code) for r, code in enumerate(codes)}
        error = ChildFailedError("boost_titan.train", failures)

        def launch():
            raise error

        return launch

    for codes, status in (((STOPPED, STOPPED), STOPPED), ((STOPPED, 1), None)):
        monkeypatch.setattr(torchrun, "torchrun_main", failing(*codes))
        if status is None:
            with pytest.raises(ChildFailedError):
                torchrun.main()
            continue
        with pytest.raises(SystemExit) as ended:
            torchrun.main()
        assert ended.value.code == status


def test_torchrun_restart_of_a_stopped_group_ends_at_once(monkeypatch, tmp_path, capsys):
    """Under a stock torchrun the stop line goes to the worker's error file; a restarted
    worker (attempt 1) finds it in attempt 0's and ends with STOPPED before training, writing
    it again for attempt 2; a restart after a crash trains."""
    line = stopped_line("SIGTERM", 4, "/x/step-4")
    run_dir = tmp_path / "torchelastic" / "none_abc"
    for attempt in range(3):
        (run_dir / f"attempt_{attempt}" / "1").mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(run_dir / "attempt_0/1/error.json"))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    record_stop(line)
    assert stopped_before() is None  # the first attempt has nothing before it
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(run_dir / "attempt_1/1/error.json"))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SystemExit) as ended:
        end_if_stopped_before()
    assert ended.value.code == STOPPED
    assert capsys.readouterr().out == f"torchrun restarted a stopped run; not training: {line}\n"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(run_dir / "attempt_2/1/error.json"))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert stopped_before() == line  # attempt 1 passed it on
    (run_dir / "attempt_1/1/error.json").write_text('{"message": {"message": "OOM"}}')
    assert stopped_before() is None  # attempt 1 crashed: train


def test_torchrun_agent_takes_the_first_signal_only():
    saved = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, torchrun._handle_once)
        with pytest.raises(SignalException):
            os.kill(os.getpid(), signal.SIGUSR1)
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR1)  # ignored: torchrun's shutdown goes on
    finally:
        signal.signal(signal.SIGUSR1, saved)


def test_launchers_pass_stop_signals_on():
    run_train = (ROOT / "run_train.sh").read_text()
    slurm = (ROOT / "scripts/slurm_train.sbatch").read_text()
    for script in (run_train, slurm):
        assert "torchrun_relay python -m boost_titan.torchrun" in script
        assert "--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in script
        assert "--shutdown-timeout" in script
    assert "#SBATCH --signal=USR1@" in slurm


# ---- the non-finite guard --------------------------------------------------------------------
def test_nonfinite_names_the_loss_first_then_the_grad_norm():
    assert nonfinite(2.5, 1.0) is None and nonfinite(2.5, None) is None
    assert nonfinite(math.nan, math.inf) == "loss became nan"
    assert nonfinite(-math.inf, 1.0) == "loss became -inf"
    assert nonfinite(2.5, math.inf) == "grad norm became inf"


def test_blame_names_the_rank():
    ok = RankView(1.0, True)
    assert blame([ok, RankView(math.nan, True)]) == "rank 1"
    assert blame([RankView(None, False), ok]) == "rank 0 has non-finite gradients"
    assert blame([ok, ok]) == "every rank's share is finite"


def test_guard_skips_up_to_its_limit_then_stops():
    stop_now = NonFiniteGuard(0)
    assert not stop_now.skip()
    message = stop_now.stop_message(7, "loss became nan", "rank 1", "/c/step-6")
    assert message.startswith("loss became nan at step 7 (rank 1); stopped before the optimizer")
    assert "(or skip such steps: --boost.skip_nonfinite_steps N)" in message
    assert message.endswith("then rerun to resume from /c/step-6")
    guard = NonFiniteGuard(2)
    assert guard.skip() and guard.skip() and not guard.skip()
    assert "2 of 2 allowed skips used" in guard.skip_line(9, "grad norm became inf", "rank 0")
    message = guard.stop_message(11, "loss became nan", "rank 0", None)
    assert "(2 steps skipped before, the [boost] skip_nonfinite_steps limit)" in message


def test_nonfinite_faults_poison_their_step_only():
    nan_fault = Fault.from_env(
        1, 2, {"BOOST_TITAN_FAULT_STEP": "3", "BOOST_TITAN_FAULT_POINT": "nan"}
    )
    assert math.isnan(nan_fault.poison_loss(3, torch.tensor(2.0)).item())
    assert nan_fault.poison_loss(4, torch.tensor(2.0)).item() == 2.0
    two = {"BOOST_TITAN_FAULT_STEP": "3,5", "BOOST_TITAN_FAULT_POINT": "nan"}
    twice = Fault.from_env(1, 2, two)
    assert [math.isnan(twice.poison_loss(s, torch.tensor(1.0)).item()) for s in (3, 4, 5)] == [
        True,
        False,
        True,
    ]
    inf_fault = Fault.from_env(
        1, 2, {"BOOST_TITAN_FAULT_STEP": "3", "BOOST_TITAN_FAULT_POINT": "inf"}
    )
    grads = [torch.zeros(2, 2)]
    inf_fault.poison_grads(2, grads)
    assert torch.isfinite(grads[0]).all()
    inf_fault.poison_grads(3, grads)
    assert grads[0][0, 0] == math.inf


def test_save_failure_names_the_reason_and_the_kept_checkpoint():
    full = {
        1: (OSError(28, "No space left on device"), None),
        0: (OSError(27, "File too large"), None),
    }
    line = save_failure(full, "/c/step-8", "/c/step-6")
    assert line == (
        "saving the checkpoint /c/step-8 failed on rank 0 (File too large); the newest complete "
        "checkpoint, /c/step-6, stays loadable: free space in (or make writable) /c, then rerun"
    )
    short = {
        0: (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 7"), None)
    }
    assert "(a write was cut short: disk full or a file-size limit); no complete" in save_failure(
        short, "/c/step-2", None
    )


@contextlib.contextmanager
def _unwritable(folder: Path):
    """`folder` refuses new entries while open: chmod for a user, the immutable attribute
    for root (who writes through any mode bits)."""
    if os.geteuid() != 0:
        folder.chmod(0o500)
        undo = lambda: folder.chmod(0o700)  # noqa: E731
    else:
        made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"root cannot make a folder unwritable here: {made.stderr.strip()}")
        undo = lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)  # noqa: E731
    try:
        yield
    finally:
        undo()


class _Checkpointer:
    """What SaveWatch reads of TorchTitan's CheckpointManager (its save future, its step
    folders), with a save that keeps the future of an async one as it does."""

    save_future = None

    def __init__(self, folder) -> None:
        self.folder = folder

    def _create_checkpoint_id(self, step: int) -> str:
        return os.path.join(self.folder, f"step-{step}")

    def save(self, state_dict, step: int, async_mode: bool) -> None:
        import torch.distributed.checkpoint as dcp

        path = self._create_checkpoint_id(step)
        if async_mode:
            self.save_future = dcp.async_save(state_dict, checkpoint_id=path)
        else:
            dcp.save(state_dict, checkpoint_id=path)


def test_unwritable_folder_names_the_failed_save_and_keeps_the_last(tmp_path):
    """One gloo rank, real DCP saves: once the checkpoint folder is unwritable, a synchronous
    save and an async one fail; the async failure, raised a step later as TorchTitan does,
    is named by the step that was saving, and the kept checkpoint loads."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ckpt = _Checkpointer(str(tmp_path))
        folders = SaveWatch(ckpt)
        state = {"w": torch.randn(8, 8)}
        ckpt.save(state, 3, async_mode=False)
        folders.saved(3)
        with _unwritable(tmp_path):
            with pytest.raises(CheckpointException) as raised:
                ckpt.save(state, 6, async_mode=False)
            assert folders.failed(raised.value, str(tmp_path / "step-6")).endswith("step-6")
            ckpt.save(state, 7, async_mode=True)
            folders.saved(7)
            error = ckpt.save_future.exception(timeout=60)
        assert isinstance(error, CheckpointException)
        failed = folders.failed(error, str(tmp_path / "step-9"))  # raised at step 9's save
        line = save_failure(error.failures, failed, latest_checkpoint(str(tmp_path)))
        reason = "Permission denied" if os.geteuid() != 0 else "Operation not permitted"
        assert line == (
            f"saving the checkpoint {tmp_path / 'step-7'} failed on rank 0 ({reason}); the "
            f"newest complete checkpoint, {tmp_path / 'step-3'}, stays loadable: free space in "
            f"(or make writable) {tmp_path}, then rerun"
        )
        loaded = {"w": torch.zeros(8, 8)}
        dcp.load(loaded, checkpoint_id=str(tmp_path / "step-3"))
        assert torch.equal(loaded["w"], state["w"])
    finally:
        dist.destroy_process_group()


# ---- the end of a run --------------------------------------------------------------------------
@pytest.mark.parametrize("finished", [True, False], ids=["finished", "after-an-error"])
def test_teardown_destroys_every_group_and_checks_in(finished):
    """One gloo rank: after `end_process_groups` no group is left (a finished run also
    passed the barrier and checked in on the store it keeps up for the others)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.new_group(backend="gloo")  # like the async checkpointer's group
    store = dist.distributed_c10d._get_default_store()
    end_process_groups(finished=finished)
    assert not dist.is_initialized()
    assert store.add(CLOSED_KEY, 0) == int(finished)
    end_process_groups(finished=finished)  # nothing left to end: a no-op


def test_documented_collective_timeouts_are_torchtitans():
    """docs/reliability.md's timeouts: TorchTitan's init / train defaults, the step after
    which `train` lowers them (to train_timeout_seconds, on the mesh's groups and the world
    group), the checkpointer's own gloo group for async saves, and torch's default timeout
    for a group created without one."""
    import inspect
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d
    import torchtitan.components.checkpoint as titan_checkpoint
    import torchtitan.distributed.utils as titan_utils
    import torchtitan.train as titan_train
    from torchtitan.config.job_config import Comm

    page = (ROOT / "docs" / "reliability.md").read_text().replace("\n", " ")
    comm = Comm()
    assert f"`comm.init_timeout_seconds` (default {comm.init_timeout_seconds} s)" in page
    assert f"`comm.train_timeout_seconds` (default {comm.train_timeout_seconds} s;" in page
    assert f"more than {comm.train_timeout_seconds} s" in page
    train = inspect.getsource(titan_train.Trainer.train)
    lowered = train[train.index("if self.step == 1:") :]
    assert "set_pg_timeouts(" in lowered and "comm.train_timeout_seconds" in lowered
    assert train.index("self.checkpointer.save(") < train.index("if self.step == 1:")
    setter = inspect.getsource(titan_utils.set_pg_timeouts)
    assert "get_all_one_dimensional_meshes" in setter and "+ [None]" in setter
    manager = inspect.getsource(titan_checkpoint.CheckpointManager)
    assert 'dist.new_group(backend="gloo")' in manager and "process_group=self.pg" in manager
    default = c10d._get_default_timeout(c10d.Backend.GLOO)
    assert default == timedelta(minutes=30) and "(30 minutes)" in page
