"""Each bad input is one `error:` line naming the problem and the fix, exit status 2, no
traceback (through `python -m boost_titan.check`, which `run_train.sh` runs first).
README's table of bad inputs lists these cases.

Every case runs in one child process (`check_each`): its file descriptors 1 and 2 are
redirected per case, so everything a case prints, logging and tracebacks included, is
its output; one interpreter start instead of one per case.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import DEBUG_TOML
from tests.helpers.commands import assert_one_error, check_each
from tests.helpers.corpus import write_tiktoken

LLAMA3_FLAGS = ["--model.name", "llama3", "--model.flavor", "debugmodel"]
"""TorchTitan's own model (`LLAMA3` below adds TP 1)."""

# name -> (arguments after --job.config_file debug.toml, fragments of the message)
CASES = {
    # each [boost] choice: its Literal type, one line naming the values
    "unknown arch": (
        ["--boost.arch", "lowrank"],
        ["unknown [boost] arch 'lowrank'; choose one of fullrank, svd, cola, lax"],
    ),
    "unknown lax_base": (
        ["--boost.lax_base", "gelu"],
        ["unknown [boost] lax_base 'gelu'; choose one of svd, cola"],
    ),
    "unknown strategy": (
        ["--boost.tp_strategy", "fast"],
        ["unknown [boost] tp_strategy 'fast'; choose one of auto, megatron, vanilla, btp"],
    ),
    "unknown rmsnorm": (
        ["--boost.rmsnorm", "fused"],
        ["unknown [boost] rmsnorm 'fused'; choose one of online, sync"],
    ),
    "overlap_chunks not a choice": (
        ["--boost.overlap_chunks", "3"],
        ["unknown [boost] overlap_chunks '3'; choose one of 1, 2, 4"],
    ),
    "unknown data_order": (
        ["--boost.data_order", "random"],
        ["unknown [boost] data_order 'random'; choose one of sharded, global"],
    ),
    "unknown flavor": (["--model.flavor", "2B"], ["model.flavor '2B'", "7B"]),
    "negative rank": (["--boost.rank", "-1"], ["rank -1", "use 0"]),
    "rank above d": (["--boost.rank", "100000"], ["rank 100000", "1..256"]),
    "fullrank with btp": (
        ["--boost.arch", "fullrank", "--boost.tp_strategy", "btp"],
        ["needs a low-rank arch", "megatron"],
    ),
    "tp not dividing heads": (
        ["--parallelism.tensor_parallel_degree", "3", "--nproc", "3"],
        ["n_heads 8", "3"],
    ),
    "negative time budget": (
        ["--boost.time_budget_minutes", "-5"],
        ["time_budget_minutes -5.0", "(0: no budget)"],
    ),
    "negative skip limit": (
        ["--boost.skip_nonfinite_steps", "-1"],
        ["skip_nonfinite_steps -1", "(0: stop at the first)"],
    ),
    "seq_len beyond max": (["--training.seq_len", "100000"], ["seq_len 100000", "2048"]),
    "cp seq_len not divisible by 2 x cp": (
        ["--parallelism.context_parallel_degree", "2", "--nproc", "4", "--training.seq_len", "250"],
        ["training.seq_len 250", "2 x context_parallel_degree (4)"],
    ),
    "cp with pipeline parallelism": (
        [
            "--parallelism.context_parallel_degree",
            "2",
            "--parallelism.pipeline_parallel_degree",
            "2",
            "--nproc",
            "8",
        ],
        ["context_parallel_degree 2", "pipeline parallelism"],
    ),
    "cp with the flex load balancer": (
        [
            "--parallelism.context_parallel_degree",
            "2",
            "--nproc",
            "4",
            "--parallelism.context_parallel_load_balancer",
            "ptrr",
        ],
        ["'ptrr'", "flex", "headtail"],
    ),
    "document attention with cp": (
        [
            "--boost.reset_attention_mask",
            "--parallelism.context_parallel_degree",
            "2",
            "--nproc",
            "4",
        ],
        ["reset_attention_mask cannot run with context parallelism", "eod_mask_loss alone"],
    ),
    "document positions with pp": (
        [
            "--boost.reset_position_ids",
            "--parallelism.pipeline_parallel_degree",
            "2",
            "--nproc",
            "4",
        ],
        ["reset_position_ids cannot run with pipeline parallelism"],
    ),
    "document options on a TorchTitan model": (
        ["--boost.reset_attention_mask", "--model.name", "llama3", "--model.flavor", "debugmodel"],
        ["model.name 'llama3'", "only boost_llama"],
    ),
    "two AC modes": (
        ["--boost.lowrank_ac", "--activation_checkpoint.mode", "full"],
        ["lowrank_ac", "keep one"],
    ),
    "unknown float8 recipe": (
        [
            "--model.converters",
            "quantize.linear.float8",
            "--quantize.linear.float8.recipe_name",
            "fast",
        ],
        ["'fast'", "tensorwise", "rowwise_with_gw_hp"],
    ),
    "float8 auto filter without thresholds": (
        [
            "--model.converters",
            "quantize.linear.float8",
            "--quantize.linear.float8.recipe_name",
            "rowwise_with_gw_hp",
            "--quantize.linear.float8.filter_fqns",
            "auto_filter_small_kn",
        ],
        ["no thresholds", "drop auto_filter_small_kn"],
    ),
    # TorchTitan settings its workers assert on (`config.titan_settings`)
    "profile_freq below warmup + active": (
        ["--profiling.enable_profiling", "--profiling.profile_freq", "2"],
        ["profile_freq 2", "profiler_warmup 3 + profiler_active 1", "to 4 or more"],
    ),
    "no profiler active steps": (
        ["--profiling.enable_profiling", "--profiling.profiler_active", "0"],
        ["profiler_active 0 must be >= 1"],
    ),
    "memory snapshot every 0 steps": (
        ["--profiling.enable_memory_snapshot", "--profiling.profile_freq", "0"],
        ["profile_freq 0 must be >= 1", "enable_memory_snapshot"],
    ),
    "wandb without its package": (
        ["--metrics.enable_wandb"],
        ["needs the wandb package", "pip install wandb", "drop --metrics.enable_wandb"],
    ),
    "log every 0 steps": (["--metrics.log_freq", "0"], ["metrics.log_freq 0 must be >= 1"]),
    "checkpoint every 0 steps": (
        ["--checkpoint.enable", "--checkpoint.interval", "0"],
        ["checkpoint.interval 0 must be >= 1"],
    ),
    "keep one checkpoint": (
        ["--checkpoint.enable", "--checkpoint.keep_latest_k", "1"],
        ["keep_latest_k 1", "keep 2 or more"],
    ),
    "gc every 0 steps": (["--training.gc_freq", "0"], ["training.gc_freq 0 must be >= 1"]),
    # options that import a module by name (`config.cli.check_module_imports`)
    "custom import": (
        ["--experimental.custom_import", "some.module"],
        ["experimental.custom_import = 'some.module'", "module some.module", "--boost.allow"],
    ),
    "custom config module": (
        ["--job.custom_config_module", "some.module"],
        ["job.custom_config_module = 'some.module'", "--boost.allow_custom_import"],
    ),
    "custom args module": (
        ["--experimental.custom_args_module", "some.module"],
        ["experimental.custom_args_module = 'some.module'", "--boost.allow_custom_import"],
    ),
    # the optimizer: its name, LORO's settings and what LORO cannot keep exact (`config.optimizer`)
    "unknown optimizer": (
        ["--optimizer.name", "Lion"],
        ["unknown optimizer.name 'Lion'; choose one of Adam, AdamW, LORO"],
    ),
    **{
        f"LORO with {what}": (["--optimizer.name", "LORO", *args], ["optimizer.name LORO", *said])
        for what, args, said in (
            ("arch cola", ["--boost.arch", "cola"], ["arch cola (the exact step re-balances"]),
            ("arch lax", ["--boost.arch", "lax"], ["arch lax", "activation or crossing"]),
            ("arch fullrank", ["--boost.arch", "fullrank"], ["arch fullrank (no low-rank"]),
            (
                "an early step in backward",
                ["--boost.arch", "svd", "--optimizer.early_step_in_backward"],
                ["optimizer.early_step_in_backward"],
            ),
            (
                "bf16 weights",
                ["--boost.arch", "svd", "--training.dtype", "bfloat16"],
                ["training.dtype bfloat16 (LORO updates fp32 master factors)"],
            ),
            (
                "CPU offload",
                ["--boost.arch", "svd", "--training.enable_cpu_offload"],
                ["training.enable_cpu_offload"],
            ),
            (
                "float8",
                ["--boost.arch", "svd", "--model.converters", "quantize.linear.float8"],
                ["model.converters ['quantize.linear.float8']"],
            ),
            ("a TorchTitan model", LLAMA3_FLAGS, ["model.name 'llama3'"]),
        )
    },
    "LORO exact every 0 steps": (
        ["--boost.loro_exact_every", "0"],
        ["boost.loro_exact_every 0 is outside the sane range 1..1,000,000,000,000"],
    ),
    "LORO negative re-warm": (
        ["--boost.loro_rewarm_steps", "-1"],
        ["boost.loro_rewarm_steps -1 is outside the sane range 0..1,000,000,000,000"],
    ),
    "LORO NaN scale": (["--boost.loro_approx_scale", "nan"], ["boost.loro_approx_scale nan"]),
}


def _missing_dataset(d: Path) -> list[str]:
    return ["--training.dataset_path", str(d / "none")]


def _empty_dataset(d: Path) -> list[str]:
    (d / "empty.txt").touch()
    return ["--training.dataset_path", str(d)]


def _checkpoint_not_a_folder(d: Path) -> list[str]:
    return ["--checkpoint.initial_load_path", str(d / "step-3")]


def _checkpoint_without_checkpointing(d: Path) -> list[str]:
    return ["--checkpoint.initial_load_path", str(d), "--checkpoint.no_enable"]


def _truncated_checkpoint(d: Path) -> list[str]:
    """A checkpoint folder with shards but no DCP .metadata (a crash while saving)."""
    (d / "__0_0.distcp").write_bytes(b"\0" * 16)
    return ["--checkpoint.initial_load_path", str(d)]


def _tokenizer_model_file(d: Path) -> list[str]:
    """TorchTitan raises a bare Exception for a path ending in tokenizer.model."""
    (d / "tokenizer.model").write_text("not a tokenizer\n")
    return ["--model.hf_assets_path", str(d / "tokenizer.model")]


def _unreadable_tokenizer(d: Path) -> list[str]:
    (d / "tokenizer.model").write_text("not a tokenizer\n")
    return ["--model.hf_assets_path", str(d)]


def _prepared(d: Path, assets: str = "default") -> Path:
    """A small prepared dataset under `d` (`python -m boost_titan.prepare`'s library)."""
    from boost_titan.data import prepare_corpus

    lines = [json.dumps({"text": f"document {i} " * 40}) + "\n" for i in range(40)]
    (d / "corpus.jsonl").write_text("".join(lines))
    plan = prepare_corpus.make_plan([str(d / "corpus.jsonl")], assets, held_out_percent=0)
    prepare_corpus.prepare(plan, str(d / "prepared"))
    return d / "prepared"


def _prepared_by_another_tokenizer(d: Path) -> list[str]:
    from boost_titan.data import prepare_default_assets

    other = d / "other_tokenizer"
    shutil.copytree(prepare_default_assets(), other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": False}))
    return ["--training.dataset_path", str(_prepared(d, str(other)))]


def _prepared_vocab_past_the_model(d: Path) -> list[str]:
    folder = _prepared(d)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["tokenizer"]["vocab_size"] = 50_000  # ids the debug model (4096 rows) lacks
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return ["--training.dataset_path", str(folder)]


def _prepared_truncated_shard(d: Path) -> list[str]:
    folder = _prepared(d)
    shard = folder / "shard-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    return ["--training.dataset_path", str(folder)]


def _mix_weights_sum_to_zero(d: Path) -> list[str]:
    folder = _prepared(d)
    return ["--boost.data_mix", f"web={folder}:0,code={folder}:0"]


LLAMA3 = [*LLAMA3_FLAGS, "--parallelism.tensor_parallel_degree", "1"]


def _llama3_with_a_tiktoken_file(d: Path) -> list[str]:
    """TorchTitan's models read HF tokenizer files only (tokenizer.json, ...)."""
    tokenizer = d / "llama3-like"
    write_tiktoken(tokenizer / "tokenizer.model")
    return [*LLAMA3, "--model.hf_assets_path", str(tokenizer)]


def _llama3_tokenizer_past_its_vocabulary(d: Path) -> list[str]:
    """A 3000-token HF tokenizer for llama3's debugmodel (2048 rows, never grown)."""
    from tokenizers import Tokenizer, models

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.add_tokens([f"t{i}" for i in range(2999)])
    tokenizer.save(str(d / "tokenizer.json"))
    return [*LLAMA3, "--model.hf_assets_path", str(d)]


# name -> (writes the case's files into its folder and returns its arguments, fragments)
FILE_CASES: dict[str, tuple[Callable[[Path], list[str]], list[str]]] = {
    "missing dataset": (_missing_dataset, ["does not exist", "point it at"]),
    "empty dataset": (_empty_dataset, ["holds no documents", "add some text"]),
    "checkpoint path not a folder": (_checkpoint_not_a_folder, ["is not a folder", "step-N"]),
    "initial checkpoint without checkpointing": (
        _checkpoint_without_checkpointing,
        ["is ignored while checkpoint.enable is false", "add --checkpoint.enable"],
    ),
    "truncated checkpoint": (_truncated_checkpoint, ["no DCP .metadata", "complete step-N"]),
    "tokenizer.model file path": (_tokenizer_model_file, ["pass the folder that holds"]),
    "unreadable tokenizer": (_unreadable_tokenizer, ["is not", "tiktoken BPE file"]),
    "prepared by another tokenizer": (
        _prepared_by_another_tokenizer,
        ["was prepared with the tokenizer", "other_tokenizer', not model.hf_assets_path 'default'"],
    ),
    "prepared vocabulary past the model's": (
        _prepared_vocab_past_the_model,
        ["50000-token vocabulary but the model has 4096 rows"],
    ),
    "prepared shard truncated": (
        _prepared_truncated_shard,
        ["shard-00000.bin is", "the manifest says", "prepare"],
    ),
    "mix weights sum to zero": (_mix_weights_sum_to_zero, ["weights sum to 0", "positive weight"]),
    "TorchTitan model with a tiktoken file": (
        _llama3_with_a_tiktoken_file,
        ["llama3 cannot load its tokenizer", "tokenizer.json"],
    ),
    "TorchTitan model's vocabulary too small": (
        _llama3_tokenizer_past_its_vocabulary,
        ["the tokenizer has 3000 tokens but llama3 debugmodel embeds 2048"],
    ),
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every case's result: CASES on debug.toml, FILE_CASES also with their own files; each
    case's dump folder is its own."""
    root = tmp_path_factory.mktemp("bad_inputs")
    argvs = {}
    for i, name in enumerate([*CASES, *FILE_CASES]):
        folder = root / f"case{i}"
        folder.mkdir()
        if name in CASES:
            args = CASES[name][0]
            nproc = [] if "--nproc" in args else ["--nproc", "2"]
        else:
            args, nproc = FILE_CASES[name][0](folder), ["--nproc", "2"]
        dump = ["--job.dump_folder", str(folder / "dump")]  # not the checkout's outputs/debug
        argvs[name] = [*nproc, "--job.config_file", str(DEBUG_TOML), *dump, *args]
    return dict(zip(argvs, check_each(list(argvs.values()), root), strict=True))


@pytest.mark.parametrize("case", list(CASES))
def test_bad_model_or_parallel_setting(checked, case):
    assert_one_error(checked[case], *CASES[case][1])


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_bad_file(checked, case):
    assert_one_error(checked[case], *FILE_CASES[case][1])
