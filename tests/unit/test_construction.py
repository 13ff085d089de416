"""`check` builds what the worker builds before training (`boost_titan.job.construction`), for
any TrainSpec: TorchTitan's llama3 and TrainSpecs a user registers through
`--experimental.custom_import` (`tests.helpers.user_spec`). A job it accepts trains
(`tests/distributed/test_titan_models.py`); each job that would die while the trainer is
built gets one `error:` line and exit 2, and so does a checkpoint that is not the job's
model (here one of ours, for llama3). All cases in one child (`check_each`).
"""

from __future__ import annotations

import pytest

from boost_titan.data.tokenizer import prepare_default_assets
from tests.helpers import DEBUG_TOML
from tests.helpers.checkpoints import save_model_checkpoint
from tests.helpers.commands import assert_one_error, check_each
from tests.helpers.corpus import write_hf_tokenizer

USER_SPECS = [
    "--experimental.custom_import",
    "tests.helpers.user_spec",
    "--boost.allow_custom_import",
]

# case -> (extra arguments, fragments of its one error line; None: config ok); in this order:
# the child registers the user's TrainSpecs at the first case that imports them
CASES = {
    "unregistered name": (
        ["--model.name", "user_decoder"],
        ["unknown model.name 'user_decoder'", "--experimental.custom_import"],
    ),
    "llama3": ([], None),
    "user TrainSpec": (["--model.name", "user_decoder", *USER_SPECS], None),
    "no init_weights": (
        ["--model.name", "user_no_init", *USER_SPECS],
        ["model user_no_init debugmodel: NoInitDecoder has no init_weights(buffer_device)"],
    ),
    "no such flavor": (
        ["--model.flavor", "tiny"],
        ["model.flavor 'tiny': llama3 has no such flavor; choose one of debugmodel,"],
    ),
    "default validation: the default corpus's held-out split": (["--validation.enable"], None),
    "validation from the Hub": (
        ["--validation.enable", "--validation.dataset", "c4"],
        [
            "validation.dataset 'c4': llama3's validator (TorchTitan's) cannot load it",
            "OfflineModeIsEnabled",
            "--validation.dataset stdlib_validation",
        ],
    ),
    "TorchTitan's test data": (
        ["--training.dataset", "c4_test"],
        ["training.dataset 'c4_test': llama3's dataloader cannot be built: FileNotFoundError"],
    ),
    "no tokenizer": (
        ["--model.hf_assets_path", "default"],
        ["model.hf_assets_path 'default': llama3 cannot load its tokenizer: FileNotFoundError"],
    ),
    "a checkpoint of our model": (
        ["--job.dump_folder", "{ours}", "--training.steps", "10"],
        [
            "error: the checkpoint to resume from, ",
            "but the job's model (llama3 debugmodel) expects",
            "or train with the model.name and model.flavor it was saved with",
        ],
    ),
    "tokenizer too large": (
        ["--model.hf_assets_path", str(prepare_default_assets())],  # our 4096-token default
        ["the tokenizer has 4096 tokens but llama3 debugmodel embeds 2048"],
    ),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("construction")
    tokenizer = write_hf_tokenizer(root / "tokenizer")
    base = [
        "--nproc",
        "1",
        "--job.config_file",
        str(DEBUG_TOML),
        "--job.dump_folder",
        str(root / "dump"),
        "--model.name",
        "llama3",
        "--model.flavor",
        "debugmodel",
        "--model.hf_assets_path",
        str(tokenizer),
        "--training.dataset",
        "stdlib",
        "--parallelism.tensor_parallel_degree",
        "1",
        "--validation.no_enable",
    ]
    ours = root / "ours"
    save_model_checkpoint(ours / "checkpoint" / "step-3", with_state=True)
    argvs = [base + [a.format(ours=ours) for a in extra] for extra, _ in CASES.values()]
    outcomes = check_each(argvs, root)
    return dict(zip(CASES, outcomes, strict=True))


@pytest.mark.parametrize("case", CASES)
def test_check_builds_what_the_worker_builds(results, case):
    result, (_, fragments) = results[case], CASES[case]
    if fragments is None:
        assert result.returncode == 0, result.stdout
        name = "user_decoder" if "user" in case else "llama3"
        # no family of ours: check and the perf model say what they do not check or price
        head = f"config ok: {name} debugmodel (no family of boost_titan: TorchTitan's construction"
        assert result.stdout.startswith(head), result.stdout
        assert f"model.name '{name}'" in result.stdout and "not priced" in result.stdout
        assert "cola" not in result.stdout.splitlines()[0]  # no arch of ours on their model
    else:
        assert result.returncode == 2
        assert_one_error(result, *fragments)
