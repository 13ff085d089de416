"""Crash recovery's pieces in one process: the shared-store warning, which checkpoints are
incomplete, and where a test fault fires (`tests/distributed/test_reliability.py`: runs that
are interrupted, crash or are repeated reproduce an uninterrupted one)."""

from __future__ import annotations

import pytest

from boost_titan.config.errors import ConfigError
from boost_titan.runtime.restarts import Fault, incomplete_checkpoints, shared_store_warning


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
    assert (fault.step, fault.point) == (5, "step")
    restarted = env | {"TORCHELASTIC_RESTART_COUNT": "1"}
    assert Fault.from_env(rank=1, world_size=2, env=restarted) is None
    assert Fault.from_env(rank=1, world_size=2, env={}) is None
    with pytest.raises(ConfigError, match="integers"):
        Fault.from_env(rank=1, world_size=2, env={"BOOST_TITAN_FAULT_STEP": "five"})
    with pytest.raises(ConfigError, match="'step' or 'save'"):
        Fault.from_env(rank=1, world_size=2, env=env | {"BOOST_TITAN_FAULT_POINT": "later"})
