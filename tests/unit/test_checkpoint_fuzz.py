"""The seeded mutation fuzzer over a real checkpoint (`tests.helpers.checkpoint_fuzz`), run
in one child interpreter under a memory cap and a per-case alarm, so that a crash shows as
a failure here rather than a dead pytest. BOOST_FUZZ_CASES (default 1500) and
BOOST_FUZZ_SEED (default 0) set the budget and the seed: `BOOST_FUZZ_CASES=50000 pytest
tests/unit/test_checkpoint_fuzz.py -k fuzzed` for a longer run. Then every checkpoint guard,
switched off in turn, must be found by the same fuzzer. The hand-built cases of issues 39
and 46: `test_hostile_checkpoints.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import ROOT
from tests.helpers.checkpoint_guards import GUARDS

CASES = int(os.environ.get("BOOST_FUZZ_CASES", "1500"))
SEED = os.environ.get("BOOST_FUZZ_SEED", "0")
BROKEN_CASES = 300
"""Cases of a run with one guard switched off: the hole must show within them."""
BROKEN_SECONDS = 5
"""The alarm of a case while a guard is off (a flood or a FIFO then runs into it)."""


def fuzz(tmp_path, cases: int, broken: list[str] | None = None) -> tuple[int, dict]:
    """(exit status of the child, its results)."""
    results = tmp_path / "results.json"
    command = [sys.executable, "-W", "ignore", "-m", "tests.helpers.checkpoint_fuzz"]
    command += [str(results), "--cases", str(cases), "--seed", SEED]
    if broken:
        command += ["--break", ",".join(broken), "--case-seconds", str(BROKEN_SECONDS)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")  # big frees go back to the system
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert results.exists(), done.stderr[-3000:]
    return done.returncode, json.loads(results.read_text())


def test_fuzzed_checkpoints_load_or_give_one_line(tmp_path):
    """Every case loads or is one ConfigError line; no payload, no file outside, no class
    changed, no crash, no case past its alarm, its memory or its comparisons, nothing
    loaded nested or cyclic or at another step, peak RSS under 1.5 GiB."""
    status, results = fuzz(tmp_path, CASES)
    assert status == 0 and results["started"] is None, results.get("started")
    assert results["failures"] == [], results["failures"][:5]
    outcomes = results["outcomes"]
    assert sum(outcomes.values()) == CASES and outcomes["ok"] > 0 and outcomes["refused"] > 0
    families = set(results["kinds"])  # each mutation reached its target
    expected = {
        ".metadata",
        "dataloader",
        "train_state.step",
        "tok_embeddings.weight",
        "big.weight",
    }
    assert expected | {"step", "item"} <= families, families
    assert results["peak_rss_mib"] < 1536, results["peak_rss_mib"]


def test_fuzzer_finds_each_guard_switched_off(tmp_path):
    """With each checkpoint guard switched off in turn (`checkpoint_guards.GUARDS`: the
    allowlist, BUILD, the opcode cap, tuple depth, nesting, BYTEARRAY8, hash flooding,
    stored byte items, metadata types, confinement, special files, declared bytes, zip
    records, the chunk index, the step folder, the train step), the same fuzzer, not told
    which, fails within BROKEN_CASES cases, and its failure shows that hole. A child that
    dies (a segfault) counts for the guard in flight; the others run in a new child."""
    remaining, found = list(GUARDS), {}
    while remaining:
        status, results = fuzz(tmp_path, BROKEN_CASES, remaining)
        found.update(results["broken"])
        crashed = results["started"]
        if crashed is not None:  # the interpreter died in that guard's case
            found[crashed["guard"]] = {"kind": crashed["kind"], "detail": f"crashed ({status})"}
        left = [guard for guard in remaining if guard not in found]
        assert left != remaining, (status, results.get("started"))  # no guard got through
        remaining = left
    missed = {guard: found[guard] for guard in GUARDS if found[guard] is None}
    assert not missed, f"the fuzzer missed {sorted(missed)}"
    unlike = {
        guard: found[guard]
        for guard, (_, signs) in GUARDS.items()
        if not any(sign in found[guard]["detail"] for sign in signs)
    }
    assert not unlike, unlike
