"""`python -m boost_titan.loss_compare` and its measurement (`bench.measure.loss_curves`):
lining runs up, the checks, the report (the runs themselves are exercised by
test_training_parity.py, which launches as it does)."""

from __future__ import annotations

import pytest

from boost_titan.bench.measure.loss_curves import compare, smooth
from boost_titan.config.errors import ConfigError
from boost_titan.loss_compare import main, plot, table


def _rows(losses: list[float], norms: list[float] | None = None) -> list[dict]:
    norms = norms or [1.0] * len(losses)
    return [
        {"step": i + 1, "loss": loss, "grad_norm": norm}
        for i, (loss, norm) in enumerate(zip(losses, norms, strict=True))
    ]


def _val(loss: float) -> list[dict]:
    return [{"step": 10, "validation_loss": loss}]


def test_smooth_is_a_trailing_mean():
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_exact_differences_over_the_exact_steps_only():
    rows = {"tp1": _rows([5.0, 4.0, 3.0]), "tp2": _rows([5.0, 4.00002, 3.5], [1.0, 1.000001, 2.0])}
    c = compare(rows, {}, exact_steps=2, window=1)
    loss, grad = c.exact()
    assert loss == pytest.approx(2e-5) and grad == pytest.approx(1e-6)
    assert compare(rows, {}, exact_steps=3, window=1).exact()[0] == pytest.approx(0.5)
    assert "| 1-2 | 4.000000 | 1.000000 | 2.0e-05 / 1.0e-06 |" in table(c, every=2)


def test_drift_is_judged_against_the_seed_run():
    """After the exact steps a layout must stay closer to the reference than a run from
    other initial weights, in smoothed loss and in final validation loss; a full-rank run
    is shown, never judged."""
    ref = [5.0, 4.0, 3.0, 2.0]
    rows = {
        "tp1": _rows(ref),
        "tp2": _rows([5.0, 4.0, 3.01, 2.01]),
        "vanilla-tp2": _rows([5.0, 4.0, 3.5, 2.5]),
        "tp1-seed1": _rows([5.2, 4.2, 3.2, 2.2]),
        "fullrank-tp2": _rows([9.0, 9.0, 9.0, 9.0]),
    }
    vals = {
        "tp1": _val(2.0),
        "tp2": _val(2.001),
        "vanilla-tp2": _val(2.1),
        "tp1-seed1": _val(2.05),
        "fullrank-tp2": _val(9.0),
    }
    c = compare(rows, vals, exact_steps=2, window=1)
    assert c.drift_failures() == ["vanilla-tp2"]
    assert c.kind("fullrank-tp2") == "other" and c.exact()[0] == 0.0
    vals["tp2"] = _val(2.3)  # closer in training loss, further in validation loss
    assert compare(rows, vals, exact_steps=2, window=1).drift_failures() == ["vanilla-tp2", "tp2"]


def test_plot_writes_a_png(tmp_path):
    rows = {
        "tp1": _rows([5.0, 4.0, 3.0]),
        "tp2": _rows([5.0, 4.0, 3.1]),
        "fullrank-tp2": _rows([6.0, 5.0, 4.0]),
    }
    plot(compare(rows, {}, exact_steps=3, window=1), tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_of_other_steps_are_refused():
    with pytest.raises(ConfigError, match="other steps"):
        compare({"tp1": _rows([1.0, 2.0]), "tp2": _rows([1.0])}, {}, 2, 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layouts", "tp1"], "two or more"),
        (["--layouts", "tp1,tp3"], "unknown: tp3"),
        (["--layouts", "tp1-seed1,tp2"], "reference layout"),
        (["--layouts", "tp1,dp2", "--global-batch", "3"], "--global-batch 3 does not divide"),
        (
            ["--layouts", "tp1,dp2", "--validation-batch", "5"],
            "--validation-batch 5 does not divide",
        ),
        (["--steps", "0"], "--steps"),
    ],
)
def test_bad_input_is_one_line(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error: ") and message in err
    assert len(err.splitlines()) == 1
