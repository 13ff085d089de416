"""Command line: a 2-process training smoke run (the shared `two_process_run`)."""

from __future__ import annotations

import re

from boost_titan.checkpoint.files import read_metadata
from tests.helpers import DEBUG_TOML

LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")
TAIL = re.compile(
    r"  eta \S+(?: \S+)? \([0-9.e+-]+ s/step x (?P<left>[\d,]+) steps\)  "
    r"data wait [0-9.]+ ms \((?P<share>[0-9.]+)%\)$"
)
MEMORY = re.compile(
    r"memory at step 1 on rank 0: (?P<measured>-?[0-9.]+) GiB measured \(peak RSS less .*\) vs "
    r"(?P<predicted>[0-9.]+) GiB predicted \((?P<change>[+-][0-9.]+)%; boost_titan\.perf\.memory"
)


def test_two_process_training_learns(two_process_run):
    """debug.toml (CoLA, BTP TP=2) on 2 CPU processes, on a local JSON-lines corpus with a
    tiktoken tokenizer folder (the real-data path of docs/gpus.md): the model's vocabulary
    is the tokenizer's, each step accumulates the micro-batches `[boost]
    gradient_accumulation_steps` asks for, and the logged loss goes down."""
    output = two_process_run.output
    corpus = two_process_run.flags[two_process_run.flags.index("--training.dataset_path") + 1]
    assert f"Preparing local dataset from {corpus}" in output, output[-4000:]
    training = "\n".join(line for line in output.splitlines() if "validate step" not in line)
    losses = [(int(s), float(v)) for s, v in LOSS.findall(training)]
    assert [s for s, _ in losses] == [1, 5, 10], output[-4000:]
    assert losses[-1][1] < losses[0][1] - 0.5, losses
    assert "Summary: ran 10 steps (1-10)" in output
    # [boost] gradient_accumulation_steps 2 x local_batch_size 4 x DP 1 (TP 2): 8 sequences
    assert "global batch size 8, gradient accumulation steps 2" in output
    assert {row["tokens"] for row in two_process_run.rows} == {8 * 256}
    step = two_process_run.folder / "checkpoint" / "step-10"
    metadata = read_metadata(str(step), "the run's checkpoint").state_dict_metadata
    vocab = 256 + 4 + 2  # the tokenizer's bytes, merges, BOS and EOS
    assert tuple(metadata["tok_embeddings.weight"].size) == (vocab, 256)
    assert len(two_process_run.rows) == 10


def test_the_run_can_be_watched(two_process_run):
    """Each step line ends with an ETA (median step time x steps left) and the step's wait
    for data; after step 1, rank 0's measured peak RSS next to the memory model's
    prediction; the summary totals the waits."""
    steps = [line for line in two_process_run.output.splitlines() if LOSS.search(line)]
    steps = [line for line in steps if "validate step" not in line]
    assert len(steps) == 3, steps
    tails = [TAIL.search(line) for line in steps]
    assert all(tails), steps
    assert [int(t["left"].replace(",", "")) for t in tails] == [9, 5, 0]
    for tail in tails:
        assert 0 <= float(tail["share"]) < 100
    memory = MEMORY.search(two_process_run.output)
    assert memory, two_process_run.output[-4000:]
    measured, predicted, change = (float(memory[k]) for k in ("measured", "predicted", "change"))
    assert predicted > 0
    # the memory model's rank-0 figure for the job as given, with the tokenizer's vocabulary
    from boost_titan.boost_llama.spec import job_args
    from boost_titan.config.cli import parse_job_config
    from boost_titan.perf.fits import rank0_prediction

    job = parse_job_config(["--job.config_file", str(DEBUG_TOML), *two_process_run.flags])
    model, _ = rank0_prediction(job, 2, job_args(job).vocab_size)
    assert f"{model / 2**30:.3f}" == memory["predicted"]
    exact = model / 2**30  # the measured GiB printed is rounded to 0.001
    assert abs(100 * (measured - exact) / exact - change) < 100 * 0.0006 / exact
    assert re.search(
        r"waited for data \d+\.\d+ s over 10 steps \(\d+\.\d% of step time\)",
        two_process_run.output,
    )
