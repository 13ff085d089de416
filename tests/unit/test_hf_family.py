"""The `hf` model family without torchrun: the model as the trainer builds it (meta device,
the plan, `to_empty`, `init_weights`) starts from the folder's weights converted as
`to_low_rank` converts them (SVD pairs) with its rotary buffers recomputed, on a 1-rank
gloo mesh (the weights DTensors); the jobs the family does not train yet, refused in one
line by `check`. `tests/distributed/test_hf_family.py` trains, resumes and exports one."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.helpers import DEBUG_TOML
from tests.helpers.commands import assert_one_error, check_each
from tests.helpers.hf_models import write_pretrained


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return write_pretrained(tmp_path_factory.mktemp("hf") / "pretrained")


@pytest.fixture(scope="module")
def folders(pretrained, tmp_path_factory):
    """The untied folder, and one whose head is its embedding (tie_word_embeddings)."""
    tied = write_pretrained(tmp_path_factory.mktemp("hf") / "tied", tied=True)
    return {False: pretrained, True: tied}


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh

    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


@pytest.mark.parametrize("arch, tied", [("cola", False), ("fullrank", False), ("fullrank", True)])
def test_built_model_starts_from_the_folder(folders, world_of_one, arch, tied):
    """Every weight equal, bit for bit, to transformers' `from_pretrained` of the folder
    converted by `to_low_rank(init="svd")` (fullrank: unconverted), and so the logits (to
    fp32 rounding: the plan's styles sum in another order); the buffers the meta build
    left empty (rotary frequencies) are the folder model's. A tied folder's model trains
    with its head untied, starting from the embedding (the plans shard the two apart)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoModelForCausalLM

    from boost_titan.hf_family.args import ACTIVATIONS, HfModelArgs, read_config
    from boost_titan.hf_family.model import build_hf_model
    from boost_titan.parallelize import apply_plan, btp_plan, hf_layout, megatron_plan, to_low_rank

    pretrained = folders[tied]
    folder = str(pretrained)
    args = HfModelArgs(folder=folder, arch=arch, rank=16, config=read_config(folder))
    with torch.device("meta"):
        model = build_hf_model(args)
    plan = btp_plan if args.low_rank else megatron_plan
    apply_plan(model, world_of_one, plan(hf_layout(model), loss_parallel=False))
    model.to_empty(device="cpu")
    model.init_weights(buffer_device=None)
    reference = AutoModelForCausalLM.from_pretrained(str(pretrained), attn_implementation="sdpa")
    if args.low_rank:
        to_low_rank(reference, 16, layout=hf_layout(reference), activation=ACTIVATIONS[arch])
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    expected = reference.state_dict()
    assert sorted(full) == sorted(expected)
    for key, value in full.items():
        assert torch.equal(value, expected[key]), key
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the plan's styles compute in another order: fp32 rounding
        torch.testing.assert_close(model(ids), reference(ids).logits, rtol=1e-5, atol=1e-6)
    buffers = dict(reference.named_buffers())
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, buffers[name]), name


def test_jobs_the_family_does_not_train_are_one_line(pretrained, tmp_path):
    """`check` refuses, in one `error:` line naming the option: an arch it has no
    conversion for, a folder without config.json, FSDP2 (llama3's module names), a tied
    head, BTP on a full-rank model."""
    empty = tmp_path / "no_config"
    empty.mkdir()
    base = ["--nproc", "2", "--job.config_file", str(DEBUG_TOML), "--model.name", "hf"]
    base += ["--job.dump_folder", str(tmp_path / "out")]
    folder = ["--model.hf_assets_path", str(pretrained)]
    cases = {
        "[boost] arch 'lax' is not trained by model.name hf": [*folder, "--boost.arch", "lax"],
        "cannot read config.json": ["--model.hf_assets_path", str(empty)],
        "does not support data_parallel_shard_degree > 1 (FSDP2)": [
            *folder,
            *("--parallelism.tensor_parallel_degree", "1"),
            *("--parallelism.data_parallel_shard_degree", "2"),
        ],
        "tp_strategy btp needs a low-rank arch": [
            *folder,
            *("--boost.arch", "fullrank", "--boost.tp_strategy", "btp"),
        ],
    }
    results = check_each([[*base, *argv] for argv in cases.values()], tmp_path)
    for fragment, result in zip(cases, results, strict=True):
        assert_one_error(result, fragment)
