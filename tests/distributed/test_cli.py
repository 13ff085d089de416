"""Command line: a 2-process training smoke run (the shared `two_process_run`)."""

from __future__ import annotations

import re

from boost_titan.runtime.checkpoint_files import read_metadata

LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")


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
