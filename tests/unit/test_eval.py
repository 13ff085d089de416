"""Held-out data, the evaluation loop, the run log's validation rows, and the `eval` and
`generate` commands, in one process. The multi-process equalities (validation under each
layout, `eval` under TP=2) are in test_training_parity.py."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torchtitan.components.loss import IGNORE_INDEX, cross_entropy_loss
from torchtitan.config import ConfigManager
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

from boost_titan import eval as eval_command
from boost_titan import generate as generate_command
from boost_titan.boost_llama import BoostTransformer
from boost_titan.boost_llama.eval_trained import evaluate_trained
from boost_titan.boost_llama.export_format import export
from boost_titan.boost_llama.load_trained import build, locate
from boost_titan.boost_llama.sampling import generate
from boost_titan.config.errors import ConfigError
from boost_titan.data import corpus
from boost_titan.data import tokenizer as tk
from boost_titan.data.held_out import (
    ValidationBatches,
    build_validation_batches,
    data_at,
    pack_windows,
    validation_data,
)
from boost_titan.runtime.held_out_loss import BoostValidator, evaluate
from boost_titan.runtime.run_log import RunLog, read_log
from tests.helpers import DEBUG_TOML
from tests.helpers.checkpoints import debug_args, save_checkpoint
from tests.helpers.commands import assert_one_error, check, run_module

VOCAB = 4096  # the default tokenizer's


def job_config(*args: str):
    return ConfigManager().parse_args(["--job.custom_config_module=boost_titan.config", *args])


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def repo_texts() -> list[str]:
    """Varied text: this repository's data sources."""
    return [p.read_text() for p in sorted(Path(corpus.__file__).parent.glob("*.py"))]


# ---- the held-out split of the default corpus ----------------------------------------
def test_held_out_split_is_disjoint_and_decided_by_path_alone(tmp_path):
    root = corpus.stdlib_root()
    files = corpus.python_files(root)
    held_out = corpus.split_files(root, held_out=True)
    training = corpus.split_files(root, held_out=False)
    assert sorted(held_out + training) == files and not set(held_out) & set(training)
    assert 0 < len(held_out) < 0.05 * len(files)
    # the same relative paths under another root, among other files: the same side
    for p in files[::7]:
        twin = tmp_path / p.relative_to(root)
        twin.parent.mkdir(parents=True, exist_ok=True)
        twin.write_text("x = 1\n")
    (tmp_path / "extra_module.py").write_text("y = 2\n")
    for p in files[::7]:
        assert corpus.is_held_out(tmp_path / p.relative_to(root), str(tmp_path)) == (p in held_out)
    texts = corpus.load_python_sources(root)["text"]
    held_texts = corpus.load_python_sources(root, held_out=True)["text"]
    assert len(texts) == len(training) and len(held_texts) == len(held_out)
    assert not set(texts) & set(held_texts)


def test_default_tokenizer_trains_on_training_files_only(monkeypatch):
    read = []

    def record(path: Path) -> str:
        read.append(path)
        return "x = 1\n"

    monkeypatch.setattr(tk, "read_text", record)
    tk.train_default_tokenizer()
    root = corpus.stdlib_root()
    assert read == corpus.split_files(root, held_out=False)[:: tk._TRAIN_STRIDE]
    assert not any(corpus.is_held_out(p, root) for p in read)


# ---- packing and batches ---------------------------------------------------------------
def test_windows_are_torchtitans_packing(tmp_path):
    """The validation windows are the samples torchtitan's text dataset yields (one rank)."""
    tokenizer = tk.load_tokenizer("default")
    path = write_jsonl(tmp_path / "docs.jsonl", repo_texts())
    data = data_at(str(path), "validation.dataset_path")
    windows = pack_windows(data.texts(), tokenizer, seq_len=32)
    titan = HuggingFaceTextDataset("local", str(path), tokenizer, seq_len=32, infinite=False)
    samples = [torch.cat([x["input"][:1], label]) for x, label in titan]
    assert len(samples) == len(windows) > 100
    assert all(torch.equal(s, w.long()) for s, w in zip(samples, windows, strict=True))
    assert torch.equal(pack_windows(data.texts(), tokenizer, 32, limit=5), windows[:5])


def test_batches_cut_global_batches_over_data_parallel_ranks():
    windows = torch.arange(11 * 9, dtype=torch.int32).view(11, 9)
    single = list(ValidationBatches(windows, local_batch_size=4))
    ranks = [list(ValidationBatches(windows, 2, dp_rank=r, dp_degree=2)) for r in range(2)]
    assert len(single) == len(ranks[0]) == len(ranks[1]) == 3
    for whole, *parts in zip(single, *ranks, strict=True):
        assert torch.equal(whole[0]["input"], torch.cat([p[0]["input"] for p in parts]))
        assert torch.equal(whole[1], torch.cat([p[1] for p in parts]))
    inputs, labels = single[-1][0]["input"], single[-1][1]  # windows 8..10 and one pad row
    assert torch.equal(labels[:3], windows[8:, 1:].long())
    assert torch.equal(inputs[:3], windows[8:, :-1].long())
    assert (labels[3] == IGNORE_INDEX).all()
    # a third rank gets only padding in the last batch, but runs it like the others
    third = list(ValidationBatches(windows, 2, dp_rank=2, dp_degree=4))  # rows 12, 13 of 11
    assert len(third) == 2 and (third[-1][1] == IGNORE_INDEX).all()
    assert ValidationBatches(windows, 4).tokens == 11 * 8


def test_validation_data_choice(tmp_path):
    held_out = validation_data(job_config())  # torchtitan's default name: our held-out split
    assert held_out.name == corpus.STDLIB_VALIDATION
    assert held_out.describe() == "the default corpus's held-out split"
    docs = write_jsonl(tmp_path / "v.jsonl", ["print(1)"])
    own = ["--training.dataset_path", str(docs)]
    assert validation_data(job_config(*own)) is None  # own data: no held-out documents
    local = validation_data(job_config(*own, "--validation.dataset_path", str(docs)))
    assert (local.name, local.path) == (corpus.LOCAL, str(docs))


VALIDATION_ERRORS = {
    "missing": (
        ["--validation.dataset_path", "{tmp}/none"],
        "validation.dataset_path {tmp}/none does not exist",
    ),
    "no files": (["--validation.dataset_path", "{tmp}/empty"], "holds no documents"),
    "unknown": (["--validation.dataset", "wiki"], "unknown validation.dataset 'wiki'"),
    "local without path": (["--validation.dataset", "local"], "needs a path"),
}


@pytest.mark.parametrize("case", list(VALIDATION_ERRORS))
def test_validation_data_errors(case, tmp_path):
    (tmp_path / "empty").mkdir()
    args, words = VALIDATION_ERRORS[case]
    with pytest.raises(ConfigError) as excinfo:
        validation_data(job_config(*(a.format(tmp=tmp_path) for a in args)))
    assert words.format(tmp=tmp_path) in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_validation_documents_must_give_a_sequence(tmp_path):
    tokenizer = tk.load_tokenizer("default")
    blank = data_at(str(write_jsonl(tmp_path / "blank.jsonl", ["", " \n"])), "--dataset-path")
    with pytest.raises(ConfigError, match="every document in --dataset-path .* is empty"):
        build_validation_batches(blank, tokenizer, seq_len=16, local_batch_size=2)
    short = data_at(str(write_jsonl(tmp_path / "short.jsonl", ["x = 1"])), "--dataset-path")
    with pytest.raises(ConfigError, match="fewer than seq_len \\+ 1 = 257 tokens"):
        build_validation_batches(short, tokenizer, seq_len=256, local_batch_size=2)


# ---- the evaluation loop ---------------------------------------------------------------
def tiny_model(vocab: int = 97) -> BoostTransformer:
    torch.manual_seed(0)
    args = debug_args("cola", vocab_size=vocab, dim=64, n_heads=4, ffn_dim=96, n_layers=2)
    model = BoostTransformer(args)
    model.init_weights()
    return model.eval()


def test_evaluate_gives_the_token_weighted_mean_for_any_batch_size():
    model = tiny_model()
    windows = torch.randint(0, 97, (13, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(windows[:, :-1].long())
        expected = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten().long()).item()

    def batch_loss(input_dict, labels):
        return cross_entropy_loss(model(input_dict["input"]), labels), (
            labels != IGNORE_INDEX
        ).sum()

    for batch_size in (1, 3, 8, 20):
        result = evaluate(ValidationBatches(windows, batch_size), batch_loss, True, "cpu")
        assert result.tokens == 13 * 16
        assert result.loss == pytest.approx(expected, abs=2e-6), batch_size
        assert result.perplexity == pytest.approx(math.exp(expected), rel=1e-5)
    silent = evaluate(ValidationBatches(windows, 8), batch_loss, False, "cpu")
    assert silent.tokens == 0 and math.isnan(silent.loss)  # a rank that does not own the loss


def test_validator_runs_every_freq_steps_and_at_the_last():
    validator = object.__new__(BoostValidator)  # the rule only, without a trainer around it
    validator.job_config = job_config("--validation.freq", "4", "--training.steps", "10")
    validator.batches = ValidationBatches(torch.zeros(1, 3, dtype=torch.int32), 1)
    assert [s for s in range(1, 11) if validator.should_validate(s)] == [4, 8, 10]
    validator.batches = None  # no held-out documents: never
    assert not any(validator.should_validate(s) for s in range(1, 11))


def test_run_log_records_validations(tmp_path, monkeypatch):
    clock = iter([0.0, 10.0, 12.0, 20.0, 30.0])
    monkeypatch.setattr("boost_titan.runtime.run_log.time.perf_counter", lambda: next(clock))
    log = RunLog(path=str(tmp_path / "losses.jsonl"))
    log.start()  # t=0
    log.record(1, 6.0, 100)  # t=10
    log.record_validation(1, 5.5, 64, seconds=3.0)
    log.record(2, 5.0, 100)  # t=12: the validation paused training
    log.record_validation(2, 4.5, 64, seconds=4.0)  # after the last step: not training time
    assert log.seconds == 12.0 - 3.0
    training, validation = read_log(str(tmp_path / "losses.jsonl"))
    assert [r["step"] for r in training] == [1, 2]
    assert validation[1] == {
        "step": 2,
        "validation_loss": 4.5,
        "validation_perplexity": math.exp(4.5),
        "validation_tokens": 64,
    }
    line = log.summary(final_step=2)
    assert "ran 2 steps (1-2) in 9.0 s" in line
    assert (
        "validation loss 5.5000 (step 1) -> 4.5000 (step 2), perplexity 90.02 over 64 tokens "
        "(2 runs, 7.0 s)"
    ) in line


# ---- eval and generate on a checkpoint -----------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> SimpleNamespace:
    """A CoLA debug DCP checkpoint (default tokenizer's vocab) and its export."""
    root = tmp_path_factory.mktemp("checkpoints")
    save_checkpoint(root / "step-3", debug_args("cola", VOCAB))
    export(str(root / "step-3"), str(root / "export"), arch="cola")
    data = write_jsonl(root / "docs.jsonl", repo_texts())
    return SimpleNamespace(dcp=root / "step-3", export=root / "export", data=data)


def test_eval_reads_dcp_and_export_alike(checkpoints, tmp_path):
    common = ["--dataset-path", str(checkpoints.data), "--seq-len", "64", "--steps", "3"]
    out = tmp_path / "result.json"
    from_dcp = evaluate_trained(
        eval_command.parser().parse_args(
            ["--checkpoint", str(checkpoints.dcp), "--arch", "cola", *common]
        )
    )
    eval_command.main(["--checkpoint", str(checkpoints.export), *common, "--json", str(out)])
    from_export = json.loads(out.read_text())
    assert (from_dcp["kind"], from_export["kind"]) == ("dcp", "export")
    assert from_dcp["tokens"] == from_export["tokens"] == 3 * 8 * 64
    assert from_dcp["loss"] == from_export["loss"]  # the same weights
    assert 0 < from_dcp["loss"] < 2 * math.log(VOCAB)
    assert from_dcp["perplexity"] == pytest.approx(math.exp(from_dcp["loss"]))


@pytest.fixture(scope="module")
def model(checkpoints) -> BoostTransformer:
    return build(locate(str(checkpoints.export)), torch.device("cpu"))


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return tk.load_tokenizer("default").encode("def ", add_bos=True, add_eos=False)


def test_generate_is_deterministic_for_a_seed(model, prompt):
    def sample(seed: int, **options) -> list[int]:
        return generate(model, prompt, max_new_tokens=12, seed=seed, **options)

    sampled = [sample(s, temperature=1.5) for s in (0, 0, 1)]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]
    assert all(len(ids) == 12 for ids in sampled)
    top_two = sample(3, temperature=1.5, top_k=2)
    greedy = sample(0)
    assert greedy == sample(5, temperature=0.7, top_k=1)  # top-1 sampling is greedy
    assert top_two != greedy and sample(3, temperature=1.5, top_k=2) == top_two


def test_greedy_generation_takes_the_argmax_each_step(model, prompt):
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    assert generate(model, prompt, max_new_tokens=6) == tokens[len(prompt) :]


def test_generate_command_prints_prompt_and_continuation(checkpoints, model, prompt, capsys):
    generate_command.main(
        [
            "--checkpoint",
            str(checkpoints.dcp),
            "--arch",
            "cola",
            "--prompt",
            "def ",
            "--max-new-tokens",
            "5",
            "--temperature",
            "1.5",
            "--top-k",
            "50",
            "--seed",
            "2",
        ]
    )
    tokenizer = tk.load_tokenizer("default")
    expected = generate(
        model, prompt, max_new_tokens=5, temperature=1.5, top_k=50, seed=2, stop_id=tokenizer.eos_id
    )
    assert capsys.readouterr().out == "def " + tokenizer.decode(expected) + "\n"


# ---- bad input: one line, exit 2 ---------------------------------------------------------
BAD = {
    "empty prompt": ("generate", ["--prompt", ""], "--prompt is empty"),
    "arch not matching the export": (
        "generate",
        ["--prompt", "x", "--arch", "svd"],
        "--arch svd does not match the export",
    ),
    "tokenizer not matching": (
        "eval",
        ["--tokenizer", "{tiktoken}"],
        "has 258 tokens but the checkpoint's model has vocab 4096",
    ),
    "not a checkpoint": ("eval", ["--checkpoint", "{tmp}"], "no DCP .metadata"),
    "svd and cola alike": ("eval", ["--checkpoint", "{dcp}"], "fit --arch svd or cola"),
    "lax arch for a cola checkpoint": (
        "eval",
        ["--checkpoint", "{dcp}", "--arch", "lax"],
        "does not match the checkpoint",
    ),
    "dataset without documents": ("eval", ["--dataset-path", "{blank}"], "is empty"),
    "tp not dividing": ("eval", ["--tp", "3"], "--tp 3 does not divide the 1 processes"),
    "unknown option": ("eval", ["--seqlen", "5"], "unrecognized arguments: --seqlen 5"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line(case, checkpoints, tmp_path, capsys):
    command, args, words = BAD[case]
    blank = write_jsonl(tmp_path / "blank.jsonl", ["", "  "])
    tiktoken = tmp_path / "t.tiktoken"
    tiktoken.write_text(
        "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256))
    )
    values = {"tmp": tmp_path, "dcp": checkpoints.dcp, "blank": blank, "tiktoken": tiktoken}
    args = ["--checkpoint", str(checkpoints.export), *(a.format(**values) for a in args)]
    main = {"eval": eval_command.main, "generate": generate_command.main}[command]
    with pytest.raises(SystemExit) as excinfo:
        main(args)
    assert excinfo.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines


def test_command_line_errors_are_one_line(checkpoints):
    """The real processes print nothing else (no traceback, no warning)."""
    result = run_module(
        "boost_titan.generate", "--checkpoint", str(checkpoints.dcp), "--prompt", ""
    )
    assert_one_error(result, "--prompt is empty")
    result = run_module(
        "boost_titan.eval", "--checkpoint", str(checkpoints.export), "--arch", "svd"
    )
    assert_one_error(result, "--arch svd does not match the export")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--validation.dataset_path", "{tmp}"],
            "validation.dataset_path {tmp} holds no documents",
        ),
        (
            ["--validation.seq_len", "4096"],
            "validation.seq_len 4096 exceeds the debug flavor's maximum 2048",
        ),
    ],
)
def test_check_refuses_bad_validation_settings(args, message, tmp_path):
    """`boost_titan.check` (run by run_train.sh before any worker) checks [validation]."""
    debug = [
        "--nproc",
        "2",
        "--job.config_file",
        str(DEBUG_TOML),
        "--job.dump_folder",
        str(tmp_path / "dump"),
    ]  # not the checkout's outputs/debug
    with pytest.raises(ConfigError) as excinfo:
        check([*debug, *(a.format(tmp=tmp_path) for a in args)])
    assert message.format(tmp=tmp_path) in str(excinfo.value)
