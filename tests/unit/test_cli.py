"""Command line: `boost_titan.check` one-line errors (`tests/distributed/test_cli.py`: the
2-process training smoke run)."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from boost_titan.config.cli import condense_tyro_message, with_boost_section
from boost_titan.config.errors import ConfigError
from tests.helpers import DEBUG_TOML, ROOT
from tests.helpers.commands import assert_one_error, check_each, run_module
from tests.helpers.corpus import real_data_args


def _toml(text: str) -> Callable[[Path], list[str]]:
    """A case whose job file (under its folder) holds `text`."""

    def args(folder: Path) -> list[str]:
        path = folder / "job.toml"
        path.write_text(text)
        return ["--job.config_file", str(path)]

    return args


def _debug(*args: str) -> Callable[[Path], list[str]]:
    """A case on debug.toml, its outputs under its folder."""
    return lambda folder: [
        "--job.config_file",
        str(DEBUG_TOML),
        "--job.dump_folder",
        str(folder / "o"),
        *args,
    ]


def _blocked_output(folder: Path) -> list[str]:
    (folder / "file").write_text("not a folder")
    return ["--job.config_file", str(DEBUG_TOML), "--job.dump_folder", str(folder / "file/out")]


# name -> (check's arguments, made in the case's own folder; fragments of its one error line)
ERRORS: dict[str, tuple[Callable[[Path], list[str]], list[str]]] = {
    "malformed toml": (_toml("[training\nsteps = 3\n"), ["malformed TOML", "job.toml"]),
    "missing config file": (
        lambda folder: ["--job.config_file", str(folder / "nope.toml")],
        ["not found"],
    ),
    "unknown key in toml": (_toml("[training]\nstepz = 3\n"), ["training.stepz", "training.steps"]),
    "unknown section in toml": (_toml("[trainingg]\nsteps = 3\n"), ["[trainingg]", "training"]),
    "wrong value type in toml": (_toml('[training]\nsteps = "many"\n'), ["training.steps", "int"]),
    "[boost] choice not one of its values in toml": (
        _toml('[boost]\narch = "lowrank"\n'),
        ["unknown [boost] arch 'lowrank' in", "job.toml; choose one of fullrank, svd, cola, lax"],
    ),
    "[boost] int choice not one of its values in toml": (
        _toml("[boost]\noverlap_chunks = 3\n"),
        ["unknown [boost] overlap_chunks 3 in", "job.toml; choose one of 1, 2, 4"],
    ),
    "unknown command-line option": (
        _debug("--training.stepz", "3"),
        ["--training.stepz", "--training.steps"],
    ),
    "bad command-line value": (_debug("--boost.rank", "x"), ["--boost.rank"]),
    # debug.toml is TP=2 with dp_shard -1: 3 processes cannot be split into TP pairs
    "nproc not a multiple of TP": (_debug("--nproc", "3"), ["3 processes"]),
    "nproc above the degrees": (
        _debug("--nproc", "4", "--parallelism.data_parallel_shard_degree", "1"),
        ["need 2 processes", "4 were requested"],
    ),
    "unwritable output folder": (_blocked_output, ["not writable", "--job.dump_folder"]),
    "one process for tp 2": (
        _debug("--nproc", "1"),
        [
            "1 process cannot hold tp 2",
            "fit the layout to 1: --parallelism.tensor_parallel_degree 1",
        ],
    ),
    "fixed and following batch": (
        _debug("--training.global_batch_size", "16", "--boost.gradient_accumulation_steps", "2"),
        ["global_batch_size 16 and [boost] gradient_accumulation_steps 2 both set the batch"],
    ),
    "1B on the toy corpus": (
        lambda folder: (
            ["--job.config_file", str(ROOT / "train_configs/1B.toml")]
            + ["--job.dump_folder", str(folder / "o")]
        ),
        [
            "the 1B model would train with the built-in toy corpus and the built-in 4096-token",
            "pass --training.dataset_path (your corpus) and --model.hf_assets_path (a tokenizer",
            "or --boost.allow_toy_corpus to go ahead anyway",
        ],
    ),
}
VALID = "valid config"


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """`python -m boost_titan.check` on every case of ERRORS and on debug.toml (VALID), all
    in one child process, each case in a folder of its own."""
    root = tmp_path_factory.mktemp("cli")
    argvs = {}
    for i, name in enumerate([*ERRORS, VALID]):
        folder = root / f"case{i}"
        folder.mkdir()
        argvs[name] = _debug()(folder) if name == VALID else ERRORS[name][0](folder)
    return dict(zip(argvs, check_each(list(argvs.values()), root), strict=True))


# ---- one-line errors ------------------------------------------------------------------
@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_config_or_command_line(checked, case):
    assert_one_error(checked[case], *ERRORS[case][1])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_read_only_output_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    result = run_module(
        "boost_titan.check",
        "--job.config_file",
        str(DEBUG_TOML),
        "--job.dump_folder",
        str(folder / "out"),
    )
    assert_one_error(result, "not writable")


def test_valid_config_passes(checked):
    result = checked[VALID]
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("config ok: boost_llama debug"), result.stdout
    # no --nproc or NGPU: the count the degrees imply, said as such
    assert "2 processes (tp 2; the count [parallelism] implies, no --nproc" in result.stdout
    # then the predicted peak against the GPU (none here: the planner's default, assumed)
    memory = result.stdout.splitlines()[-1]
    assert memory.startswith("memory: predicted "), result.stdout
    assert ": fits, " in memory
    if not torch.cuda.is_available():
        assert "of an assumed 80 GiB a100 (no CUDA device here" in memory


def readme_process_counts() -> list[tuple[str, int, str]]:
    """(config, processes, layout) rows of README's table of train_configs."""
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+)\.toml` \| (\d+) \| ([^|]+?) \|$", text, re.MULTILINE)
    return [(config, int(nproc), layout) for config, nproc, layout in rows]


def test_readme_lists_every_config():
    configs = sorted(p.stem for p in (ROOT / "train_configs").glob("*.toml"))
    assert sorted(config for config, _, _ in readme_process_counts()) == configs


@pytest.fixture(scope="module")
def real_data(tmp_path_factory) -> list[str]:
    """The real-data flags on a small local corpus and tiktoken tokenizer."""
    return real_data_args(tmp_path_factory.mktemp("real-data"))


@pytest.mark.parametrize("config, nproc, layout", readme_process_counts())
def test_configs_scale_with_the_gpu_count(config, nproc, layout, real_data, tmp_path, monkeypatch):
    """Each config passes `check` on README's process count (also what `check` picks
    without --nproc), and on 2x and 8x it: the extra processes are data parallelism and
    the global batch follows (4 sequences per replica for the GPU configs)."""
    from tests.helpers.commands import check as check_in_process

    monkeypatch.delenv("NGPU", raising=False)
    data = real_data if config != "debug" else []
    args = ["--job.config_file", str(ROOT / "train_configs" / f"{config}.toml"), *data]
    args += ["--job.dump_folder", str(tmp_path)]
    where = f"on {nproc} process{'es' if nproc > 1 else ''} ({layout}; the count [parallelism]"
    toml = (ROOT / "train_configs" / f"{config}.toml").read_text()
    flavor = re.search(r'^flavor = "(\w+)"', toml, re.M)[1]  # 7B_32k: 7B
    seq = re.search(r"^seq_len = (\d+)", toml, re.M)[1]
    summary = check_in_process(args)
    assert summary.startswith(f"config ok: boost_llama {flavor} (cola") and where in summary, (
        summary
    )
    for k in (1, 2, 8):
        summary = check_in_process(["--nproc", str(k * nproc), *args])
        assert f"on {k * nproc} processes (dp_shard {k}" in summary or k == 1, summary
        assert config == "debug" or f"global batch {4 * k} x seq_len {seq}" in summary, summary


def test_workers_refuse_the_toy_corpus_too():
    """A worker started without `check` (torchrun directly) stops at its dataloader, before
    reading any data; --boost.allow_toy_corpus lifts the refusal."""
    from boost_titan.boost_llama.spec import build_spec, refuse_toy_corpus
    from boost_titan.config.cli import parse_job_config

    args = ["--job.config_file", str(ROOT / "train_configs" / "7B.toml")]
    with pytest.raises(ConfigError, match="^the 7B model would train with the built-in toy"):
        build_spec().build_dataloader_fn(1, 0, None, parse_job_config(args))
    refuse_toy_corpus(parse_job_config([*args, "--boost.allow_toy_corpus"]))


def documented_launches() -> list[tuple[str, list[str]]]:
    """(command, `check` arguments) of every launch of a GPU config or of several nodes
    documented in README.md, docs/*.md and scripts/slurm_train.sbatch's header: run_train.sh
    (CONFIG_FILE, NGPU), torchrun (nodes x processes per node), sbatch (nodes x
    GPUS_PER_NODE, default 8; CONFIG_FILE default 7B) and `check` itself."""
    texts = [(ROOT / "README.md").read_text()]
    texts += [page.read_text() for page in sorted((ROOT / "docs").glob("*.md"))]
    blocks = [b for text in texts for b in re.findall(r"```bash\n(.*?)```", text, re.S)]
    header = (ROOT / "scripts" / "slurm_train.sbatch").read_text().split("\nset ")[0]
    blocks.append("\n".join(line[4:] for line in header.splitlines() if line.startswith("#   ")))
    commands = [c for b in blocks for c in re.sub(r"\\\n\s*", "", b).splitlines()]
    launches = []
    for command in commands:
        words = shlex.split(command, comments=True)
        env = {}
        while words and re.match(r"^[A-Z_]+=", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        args = _check_args(words, env)
        if args is None:
            continue
        gpu_config = re.search(r"train_configs/\d+B\.toml", " ".join(args))
        if gpu_config or "--nnodes" in command or "sbatch" in command:
            launches.append((command, args))
    return launches


def _check_args(words: list[str], env: dict[str, str]) -> list[str] | None:
    """`check`'s arguments for a launch command's words (None: not a launch)."""
    flags = dict(w.lstrip("-").split("=", 1) for w in words if w.startswith("--") and "=" in w)
    if words[:1] == ["./run_train.sh"]:
        config = env.get("CONFIG_FILE", "train_configs/debug.toml")
        nproc = ["--nproc", env["NGPU"]] if "NGPU" in env else []
        return [*nproc, "--job.config_file", config, *words[1:]]
    if words[:1] == ["torchrun"] and "boost_titan.train" in words:
        nproc = int(flags.get("nnodes", 1)) * int(flags["nproc_per_node"])
        return ["--nproc", str(nproc), *words[words.index("boost_titan.train") + 1 :]]
    if words[:1] == ["sbatch"]:
        script = words.index("scripts/slurm_train.sbatch")
        nproc = int(flags.get("nodes", 2)) * int(env.get("GPUS_PER_NODE", 8))
        config = env.get("CONFIG_FILE", "train_configs/7B.toml")
        return ["--nproc", str(nproc), "--job.config_file", config, *words[script + 1 :]]
    if words[:3] == ["python", "-m", "boost_titan.check"]:
        return words[3:]
    return None


def test_documented_multi_gpu_launches_pass_check(real_data, tmp_path, monkeypatch):
    """Every documented launch of a GPU config or of several nodes passes `check` with its
    process count; its data paths are replaced by a small local corpus and tokenizer."""
    from tests.helpers.commands import check as check_in_process

    monkeypatch.delenv("NGPU", raising=False)
    replace = dict(zip(real_data[::2], real_data[1::2], strict=True))
    launches = documented_launches()
    assert any("--nnodes" in c for c, _ in launches) and any("sbatch" in c for c, _ in launches)
    for i, (command, args) in enumerate(launches):
        args = [replace.get(prev, a) for prev, a in zip(["", *args], args, strict=False)]
        args += ["--job.dump_folder", str(tmp_path / f"out{i}")]
        assert check_in_process(args).startswith("config ok"), command


# ---- helpers --------------------------------------------------------------------------
def test_boost_section_added_once():
    flag = "--job.custom_config_module=boost_titan.config"
    assert with_boost_section(["--a", "1"]) == ["--a", "1", flag]
    assert with_boost_section(["--job.custom_config_module", "x"]) == [
        "--job.custom_config_module",
        "x",
    ]


def test_a_wrong_choice_reads_as_every_choice_does():
    """tyro's 'invalid choice' of a `Literal` option becomes the one line of every choice."""
    tyro = "invalid choice 'x' for argument '--boost.tp-strategy'. Expected one of ('a', 'b')."
    assert condense_tyro_message(tyro) == "unknown [boost] tp_strategy 'x'; choose one of a, b"
    tyro = "invalid choice '7' for argument '--parallelism.degree'. Expected one of ('1', '2')."
    assert condense_tyro_message(tyro) == "unknown parallelism.degree '7'; choose one of 1, 2"


def test_condense_tyro_message():
    boxed = (
        "╭─ Unrecognized options ─────╮\n│ Unrecognized options: --x  │\n"
        "│ ────────────────────────── │\n│ Perhaps you meant:         │\n"
        "│     --training.steps INT   │\n╰────────────────────────────╯\n"
    )
    message = condense_tyro_message(boxed)
    assert "\n" not in message
    assert message.startswith("Unrecognized options: --x; did you mean --training.steps?")


@pytest.mark.parametrize(
    "visible, count", [(None, 4), ("1,3", 2), ("2", 1), ("", 0), ("GPU-a,GPU-b,GPU-c", 3)]
)
def test_run_train_counts_the_gpus_cuda_shows(visible, count, tmp_path):
    """run_train.sh's default NGPU (`scripts/visible_gpus.sh`): the GPUs
    CUDA_VISIBLE_DEVICES names where it is set, else all nvidia-smi lists (here 4)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\nfor i in 0 1 2 3; do echo "GPU $i: NVIDIA H100 (UUID: x)"; done\n')
    smi.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    script = ROOT / "scripts" / "visible_gpus.sh"
    result = subprocess.run([str(script)], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(count)
    assert "gpus=$(scripts/visible_gpus.sh)" in (ROOT / "run_train.sh").read_text()


def test_check_memory_line_prices_the_tokenizers_vocabulary(real_data):
    """`check`'s memory line prices the model the job builds: debug.toml with the test
    tokenizer's 262 tokens, not the 32,000 `bench model` assumes for a flavor."""
    from boost_titan.check import memory_line
    from boost_titan.config.cli import parse_job_config
    from boost_titan.perf.fits import DEFAULT_GPU, fit_line
    from boost_titan.perf.job_plan import job_plan
    from boost_titan.perf.layout_search import GPU_MEMORY_GIB

    line = memory_line(parse_job_config(["--job.config_file", str(DEBUG_TOML), *real_data]), None)
    flavor = job_plan(str(DEBUG_TOML))
    built = dataclasses.replace(flavor, args=dataclasses.replace(flavor.args, vocab_size=262))
    lines = {
        job.args.vocab_size: fit_line(job, DEFAULT_GPU, GPU_MEMORY_GIB[DEFAULT_GPU], True)
        for job in (flavor, built)
    }
    assert lines[32000] != lines[262]
    assert torch.cuda.is_available() or line == lines[262]
