"""The seeded mutation fuzzer over a real checkpoint (`tests.helpers.checkpoint_fuzz`), run
in one child interpreter under a memory cap and a per-case alarm, so that a crash shows as
a failure here rather than a dead pytest. BOOST_FUZZ_CASES (default 1500) and
BOOST_FUZZ_SEED (default 0) set the budget and the seed: `BOOST_FUZZ_CASES=50000 pytest
tests/unit/test_checkpoint_fuzz.py -k fuzzed` for a longer run. The hand-built cases of issue
39: `test_hostile_checkpoints.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

CASES = int(os.environ.get("BOOST_FUZZ_CASES", "1500"))
SEED = os.environ.get("BOOST_FUZZ_SEED", "0")
BROKEN_CASES = 200
"""Cases of a run with one defence switched off: the hole must show within them."""


def fuzz(tmp_path, cases: int, broken: str | None = None) -> tuple[int, dict]:
    """(exit status of the child, its results)."""
    results = tmp_path / "results.json"
    command = [sys.executable, "-W", "ignore", "-m", "tests.helpers.checkpoint_fuzz"]
    command += [str(results), "--cases", str(cases), "--seed", SEED]
    command += ["--break", broken, "--case-seconds", "5"] if broken else []
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert results.exists(), done.stderr[-3000:]
    return done.returncode, json.loads(results.read_text())


def test_fuzzed_checkpoints_load_or_give_one_line(tmp_path):
    """Every case loads or is one ConfigError line; no payload, no file outside, no class
    changed, no crash, no case past its alarm, peak RSS under 1.5 GiB."""
    status, results = fuzz(tmp_path, CASES)
    assert status == 0 and results["started"] is None, results.get("started")
    assert results["failures"] == [], results["failures"][:5]
    outcomes = results["outcomes"]
    assert sum(outcomes.values()) == CASES and outcomes["ok"] > 0 and outcomes["refused"] > 0
    families = set(results["kinds"])  # each mutation reached its target
    assert {".metadata", "dataloader", "train_state.step", "tok_embeddings.weight"} <= families
    assert results["peak_rss_mib"] < 1536, results["peak_rss_mib"]


@pytest.mark.parametrize(
    "broken, found",
    [
        ("allowlist", ("a payload ran", "MARKER", "MemoryError", "RecursionError")),
        ("confinement", ("outside the folder", "CaseTimeout")),
    ],
)
def test_fuzzer_finds_a_defence_switched_off(broken, found, tmp_path):
    """With the restricted unpickler replaced by `pickle.loads`, or the file checks by a bare
    size lookup, the same fuzzer fails within BROKEN_CASES cases (it stops at the first):
    a payload runs, a size the file declares is allocated, or the interpreter dies on a deep
    tuple; a file outside the folder is read, or a FIFO blocks."""
    status, results = fuzz(tmp_path, BROKEN_CASES, broken)
    details = [failure["detail"] for failure in results["failures"]]
    crashed = status != 0 and results["started"] is not None
    hole = any(sign in detail for detail in details for sign in found)
    assert hole or (broken == "allowlist" and crashed), (status, details[:5])
