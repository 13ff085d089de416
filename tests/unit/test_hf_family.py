"""The `hf` model family without torchrun: the model as the trainer builds it (meta device,
the plan, `to_empty`, `init_weights`) starts from the folder's weights converted as
`to_low_rank` converts them (SVD pairs) with its rotary buffers recomputed, on a 1-rank
gloo mesh (the weights DTensors); the jobs the family does not train yet, refused in one
line by `check`; LaX: each pair's latent relayed to the next block, its export reloaded;
LaX under FSDP2 x BTP TP 2 equal to one process (`run_on_ranks`).
`tests/distributed/test_hf_family.py` trains, resumes, stops on SIGTERM and exports one."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.helpers import DEBUG_TOML
from tests.helpers.commands import assert_one_error, check_each
from tests.helpers.distributed import run_on_ranks
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
    """`check` refuses, in one `error:` line naming the option: a folder without
    config.json, PP, BTP on a full-rank model, LORO on LaX pairs."""
    empty = tmp_path / "no_config"
    empty.mkdir()
    base = ["--nproc", "2", "--job.config_file", str(DEBUG_TOML), "--model.name", "hf"]
    base += ["--job.dump_folder", str(tmp_path / "out")]
    folder = ["--model.hf_assets_path", str(pretrained)]
    cases = {
        "cannot read config.json": ["--model.hf_assets_path", str(empty)],
        "does not support pipeline_parallel_degree > 1": [
            *folder,
            *("--parallelism.tensor_parallel_degree", "1"),
            *("--parallelism.pipeline_parallel_degree", "2"),
        ],
        "tp_strategy btp needs a low-rank arch": [
            *folder,
            *("--boost.arch", "fullrank", "--boost.tp_strategy", "btp"),
        ],
        "changes a model with an activation or crossing": [  # LaX on svd: the crossing alone
            *folder,
            *("--boost.arch", "lax", "--boost.lax_base", "svd", "--optimizer.name", "LORO"),
        ],
    }
    results = check_each([[*base, *argv] for argv in cases.values()], tmp_path)
    for fragment, result in zip(cases, results, strict=True):
        assert_one_error(result, fragment)


# ---- LaX: latents relayed between blocks, BTP at TP 2 ---------------------------------------
def lax_model(folder, lax_base: str) -> torch.nn.Module:
    """The family's LaX model of `folder` at rank 16 (`build_hf_model`), every parameter
    random in float64: the crossing G too (it starts at zero from a folder), norm weights
    and biases far from 0 and 1."""
    from boost_titan.hf_family.args import HfModelArgs, read_config
    from boost_titan.hf_family.model import build_hf_model
    from tests.helpers.distributed import randomize

    args = HfModelArgs(
        folder=str(folder), arch="lax", rank=16, lax_base=lax_base, config=read_config(folder)
    )
    torch.manual_seed(0)
    model = build_hf_model(args).double()
    for name, param in model.named_parameters():
        if name.endswith("cross.weight"):
            torch.nn.init.normal_(param, std=0.3)
    randomize(model)
    return model


def test_lax_pairs_take_the_previous_blocks_latent(pretrained):
    """Each LaX pair of block 1 computes ``up(act(LayerNorm(down x + G h)))`` with h the
    latent of the same projection in block 0 during the same forward (`LatentRelay`), and
    block 0's pairs have no crossing (what `boost_llama`'s LaX does)."""
    model = lax_model(pretrained, "cola")
    blocks = model.model.layers
    seen = {}
    hooks = [
        pair.register_forward_hook(lambda m, args, out, key=key: seen.__setitem__(key, (args, out)))
        for key, pair in (("first", blocks[0].mlp.up_proj), ("second", blocks[1].mlp.up_proj))
    ]
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids)
        (x0,), _ = seen["first"]
        (x1,), y1 = seen["second"]
        _, h0 = blocks[0].mlp.up_proj.project(x0)
        expected, _ = blocks[1].mlp.up_proj.project(x1, h0)
    for hook in hooks:
        hook.remove()
    assert blocks[0].mlp.up_proj.cross is None and blocks[1].mlp.up_proj.cross is not None
    assert torch.equal(y1, expected)
    assert not torch.allclose(y1, blocks[1].mlp.up_proj.project(x1, torch.zeros_like(h0))[0])


def test_lax_export_reloads_with_its_crossing(pretrained, tmp_path):
    """A LaX model's weights exported as a Hugging Face folder (`export_hf`: config.json
    records the crossing) reload through `load_hf` with the same logits, bit for bit; a
    LaX checkpoint without `--lax-base` (svd and cola pairs have the same shapes) is one
    ConfigError line."""
    from boost_titan.config.errors import ConfigError
    from boost_titan.hf_family.export import export_hf
    from boost_titan.parallelize import load_hf

    model = lax_model(pretrained, "svd").float().eval()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError, match="pass the \\[boost\\] lax_base"):
        export_hf(state, str(tmp_path / "refused"), str(pretrained), None)
    export_hf(state, str(tmp_path / "out"), str(pretrained), None, "svd")
    loaded = load_hf(tmp_path / "out").eval()
    assert loaded.config.low_rank == {"rank": 16, "activation": None, "crossing": True}
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids))
    assert not (tmp_path / "refused").exists()


# ---- FSDP2 ------------------------------------------------------------------------------
def _fsdp_worker(rank: int, world_size: int, folder: str, tp: int, arch: str) -> dict:
    """Every gradient of the family's `arch` model (random weights, LaX's G too) after one
    backward of a 4-sequence batch: under `parallelize_hf` at dp_shard world_size / tp x
    TP `tp` (each data rank its own sequences, the loss a sum over the global token
    count, as the trainer's) and in one process on the whole batch."""
    import copy

    from torch.distributed.tensor import DTensor
    from torchtitan.distributed import ParallelDims

    from boost_titan.config.cli import parse_job_config
    from boost_titan.hf_family.model import build_hf_model
    from boost_titan.hf_family.spec import job_args, parallelize_hf
    from boost_titan.runtime.device import use_cpu_if_no_accelerator
    from tests.helpers.distributed import randomize

    torch.set_num_threads(1)
    use_cpu_if_no_accelerator()
    dp = world_size // tp
    job = parse_job_config(
        [
            *("--job.config_file", str(DEBUG_TOML), "--model.name", "hf"),
            *("--model.hf_assets_path", folder, "--boost.arch", arch),
            *("--parallelism.tensor_parallel_degree", str(tp)),
            *("--parallelism.data_parallel_shard_degree", str(dp)),
        ]
    )
    dims = ParallelDims(
        dp_shard=dp, dp_replicate=1, cp=1, tp=tp, pp=1, ep=1, etp=1, world_size=world_size
    )
    dims.build_mesh()
    torch.manual_seed(0)
    model = build_hf_model(job_args(job))
    randomize(model)
    reference = copy.deepcopy(model)
    parallelize_hf(model, dims, job)
    ids = torch.randint(0, 512, (4, 16), generator=torch.Generator().manual_seed(5))
    labels = torch.randint(0, 512, (4, 16), generator=torch.Generator().manual_seed(6))
    mine = slice(rank // tp * 4 // dp, (rank // tp + 1) * 4 // dp)
    cross_entropy = torch.nn.functional.cross_entropy
    logits = model(ids[mine])
    logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
    (cross_entropy(logits.flatten(0, 1), labels[mine].flatten(), reduction="sum") / 64).backward()
    cross_entropy(reference(ids).flatten(0, 1), labels.flatten()).backward()
    full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
    return {
        name: (full(param.grad), dict(reference.named_parameters())[name].grad)
        for name, param in model.named_parameters()
    }


def test_fsdp2_and_lax_under_btp_equal_one_process(pretrained):
    """The family's LaX model (cola base: CoLA's pairs plus the crossing) at dp_shard 2 x
    TP 2: BTP with the crossing modules replicated and latent grads not deferred
    (`family_layout`), then FSDP2 (`runtime.data_parallel.apply_fsdp_units`: embedding,
    each block, norm with head) over the TP-sharded weights. Every gradient, G and
    LayerNorm_r included, equals one process's on the whole batch (fp32, rtol 1e-5, atol
    1e-6). With BTP's deferred latent grads (which LaX must not have), or FSDP2 dividing
    the gradients by the shard count, the embedding's is the first to differ. (Measured
    too, left out for the suite's time: CoLA at dp_shard 2 alone and at dp_shard 2 x TP 2;
    LaX at TP 2 alone, float64, worst 5e-8.)"""
    for result in run_on_ranks(_fsdp_worker, 4, folder=str(pretrained), tp=2, arch="lax"):
        assert len(result) == 2 + 2 * 7 * 2 + 7 * 3 + 2 * 2 + 1  # embedding, pairs, G, norms
        assert sum(".cross." in name or ".latent_norm." in name for name in result) == 21
        for name, (grad, expected) in result.items():
            torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6, msg=name)
