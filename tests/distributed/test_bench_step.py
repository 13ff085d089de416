"""`bench step` end to end: one real trainer run (debug flavor, TP 1, bf16 compute, 4
micro-batches of 32 tokens) under torchrun, its JSON report (no timing assertions: tests
check behaviour, not speed). The weights are cast once per step, as `runtime.accumulation`
promises (`tests/unit/test_accumulation.py` compares the gradients; the trace reading is
`tests/unit/test_step_trace.py`; the one-line errors `tests/unit/test_bench_step.py`)."""

from __future__ import annotations

import json

from boost_titan.bench.__main__ import main
from tests.helpers import DEBUG_TOML

KEYS = {
    "tokens_per_s",
    "step_ms",
    "host_ms_per_microbatch",
    "launches_per_microbatch",
    "casts_per_step",
    "param_tensors",
}


def test_step_report_of_a_bf16_run(capsys):
    argv = ["step", "--steps", "1", "--warmup", "1", "--json", "-"]
    argv += ["--job.config_file", str(DEBUG_TOML), "--parallelism.tensor_parallel_degree", "1"]
    argv += ["--training.seq_len", "32", "--training.local_batch_size", "1"]
    argv += ["--training.global_batch_size", "4", "--training.mixed_precision_param", "bfloat16"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    print({k: report[k] for k in sorted(KEYS)})
    assert KEYS <= report.keys()
    assert report["microbatches"] == 4 and report["tokens_per_step"] == 4 * 32
    assert report["precision"].startswith("bf16 compute, fp32 master weights")
    assert report["device"] == "cpu" and report["kernels_per_step"] is None
    assert report["casts_per_step"] == report["param_tensors"] > 0
    assert report["launches_per_step"] > 4 * report["launches_per_microbatch"] > 0
    assert report["tokens_per_s"] > 0 and report["host_ms_per_microbatch"] > 0
    assert report["step_ms_min"] <= report["step_ms"] <= report["step_ms_max"]
    assert report["top"] and all(item["count"] > 0 for item in report["top"])
    # the data side (`bench data`): each timed step's wait in next(), one rank's loader rate
    assert report["tokens_per_rank_step"] == 4 * 32
    assert 0 < report["data_wait_ms"] <= report["data_wait_ms_max"] < report["step_ms_max"]
    assert 0 < report["data_wait_share"] <= report["data_wait_share_max"] < 1
    rate = report["tokens_per_rank_step"] / (report["data_wait_ms"] / 1e3)
    assert abs(report["loader_tokens_per_s_per_rank"] - rate) < 1e-6 * rate
