"""Training runs under different parallelisms, from one seed checkpoint, log the same loss,
the same exact gradient norm and the same held-out validation loss (launched and read as
`boost_titan.loss_compare` does: `job.launch.launch_training`, `runtime.run_log.read_log`).

Training reads this repository's `parallelize/` sources in the global order
(`[boost] data_order = "global"`): every sample is another window of real text, and each
step's global batch is the same windows at any data-parallel degree, so a layout that fed
its ranks the wrong rows would differ. Validation reads other text (`boost_titan/data/`'s
sources) in global batches of 4 sequences everywhere.

Each arch gets its own seed checkpoint and one-process (tp1) reference run, shared by the
layouts of that arch. Runs are memoized per module, so the saved-activation test reuses
the parity runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from boost_titan.boost_llama.eval_trained import evaluate_trained
from boost_titan.boost_llama.export_format import load_model_state
from boost_titan.eval import parser
from boost_titan.job.launch import launch_training, pipeline_args, torchrun_command
from boost_titan.runtime.run_log import read_log
from tests.helpers import ROOT
from tests.helpers.checkpoints import bits_equal, checkpoint_weights
from tests.helpers.commands import run_module

STEPS = 5
TOLERANCE = 1e-5
"""Largest |loss difference| from one process over the first STEPS steps (fp32)."""
GRAD_NORM_TOLERANCE = 1e-6
"""Largest relative difference of the exact (fp64) global gradient norm (fp32 training)."""
SAME_WEIGHTS_TOLERANCE = 1e-5
"""Held-out loss of one set of weights under different layouts (fp32)."""
VALIDATION_STEPS = 4
SEQ_LEN = 64


def _torchrun(nproc: int, dump: Path, *args: str) -> str:
    """Run training with the debug config; return its (rank 0) output."""
    return launch_training(nproc, ROOT / "train_configs/debug.toml", dump, args, timeout=600)


def _losses(dump: Path) -> list[float]:
    return [row["loss"] for row in read_log(str(dump / "losses.jsonl"))[0]]


def _validations(dump: Path) -> dict[int, dict]:
    """Step -> the row (loss, perplexity, tokens) of every validation the run logged."""
    return {row["step"]: row for row in read_log(str(dump / "losses.jsonl"))[1]}


def _documents(path: Path, sources: Path) -> Path:
    """A .jsonl at `path` with one document per .py file under `sources`."""
    files = sorted(sources.glob("*.py"))
    path.write_text("".join(json.dumps({"text": p.read_text()}) + "\n" for p in files))
    return path


@dataclass(frozen=True)
class Layout:
    nproc: int
    args: tuple[str, ...]
    arch: str = "cola"  # debug.toml's


@dataclass(frozen=True)
class Run:
    losses: list[float]
    grad_norms: list[float]
    validation: dict[int, dict]
    output: str
    seconds: float


def _batch(n: int) -> tuple[str, ...]:
    """Local batch of training and validation (the global one is 4 in every layout)."""
    return ("--training.local_batch_size", str(n), "--validation.local_batch_size", str(n))


TP2 = ("--parallelism.tensor_parallel_degree", "2")
DP2 = ("--parallelism.data_parallel_shard_degree", "2")
LOWRANK_AC = ("--boost.lowrank_ac",)
CP2 = ("--parallelism.context_parallel_degree", "2")
REFERENCE = ("--parallelism.tensor_parallel_degree", "1", *_batch(4))
SAVED = r"saved activations: ([0-9.]+) MiB per step on rank 0 \(step 1\)"

# Global batch 4 everywhere (local batch x DP degree). The debug flavor has 4 layers;
# with Interleaved1F1B's 2 stages per rank, TorchTitan's default split (embedding and
# norm + output count as a layer each) leaves the last stage no block at all.
INTERLEAVED = pipeline_args("Interleaved1F1B", 1)
LAYOUTS = {
    "tp2-btp": Layout(2, (*TP2, *_batch(4))),
    "dp2-tp2": Layout(4, (*TP2, *DP2, *_batch(2))),
    "pp2-tp2": Layout(4, (*TP2, *pipeline_args("1F1B", 2), *_batch(4))),
    "pp2-tp2-interleaved": Layout(4, (*TP2, *INTERLEAVED, *_batch(4))),
    "dp2-tp2-pp2": Layout(8, (*TP2, *DP2, *pipeline_args("1F1B", 1), *_batch(2))),
    "lax-pp2-tp2": Layout(4, (*TP2, *pipeline_args("1F1B", 2), *_batch(4)), arch="lax"),
    "lowrank_ac-pp2-tp2": Layout(4, (*TP2, *pipeline_args("1F1B", 2), *_batch(4), *LOWRANK_AC)),
    "cp2-tp2": Layout(4, (*TP2, *CP2, *_batch(4))),
}


class Runs:
    """Seed checkpoints, references and layout runs, each made once per module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        data = _documents(root / "training.jsonl", ROOT / "parallelize")
        self.validation_data = _documents(root / "validation.jsonl", ROOT / "boost_titan" / "data")
        self.seq_len = seq_len = SEQ_LEN
        self.validation_tokens = VALIDATION_STEPS * 4 * seq_len  # global batch 4
        self.common = [
            "--training.dataset_path",
            str(data),
            "--training.seq_len",
            str(seq_len),
            "--boost.data_order",
            "global",
            "--training.steps",
            str(STEPS),
            "--metrics.log_freq",
            "1",
            "--metrics.no_enable_tensorboard",
            "--lr_scheduler.warmup_steps",
            "2",
            "--debug.seed",
            "7",
            "--model.flavor",
            "debug",
            "--validation.enable",
            "--validation.dataset_path",
            str(self.validation_data),
            "--validation.seq_len",
            str(seq_len),
            "--validation.steps",
            str(VALIDATION_STEPS),
            "--validation.freq",
            str(STEPS),
        ]
        self.done: dict[str, Run] = {}

    def seed(self, arch: str) -> Path:
        """The arch's seed checkpoint (step-0), made on first use."""
        seed = self.root / f"seed-{arch}"
        if not seed.exists():
            _torchrun(
                1,
                seed,
                *self.common,
                "--boost.arch",
                arch,
                "--checkpoint.enable",
                "--checkpoint.create_seed_checkpoint",
                "--parallelism.tensor_parallel_degree",
                "1",
            )
        return seed / "checkpoint" / "step-0"

    def _train(self, name: str, nproc: int, arch: str, *args: str, start: str = "") -> Run:
        """A run from `start` (the arch's seed checkpoint if empty), made once per name."""
        if name not in self.done:
            load = [
                "--checkpoint.enable",
                "--checkpoint.initial_load_path",
                start or str(self.seed(arch)),
                "--checkpoint.interval",
                "1000",
            ]
            dump = self.root / name
            start = time.perf_counter()
            output = _torchrun(nproc, dump, *self.common, "--boost.arch", arch, *load, *args)
            seconds = time.perf_counter() - start
            steps, validations = read_log(str(dump / "losses.jsonl"))
            self.done[name] = Run(
                [r["loss"] for r in steps],
                [r["grad_norm"] for r in steps],
                {r["step"]: r for r in validations},
                output,
                seconds,
            )
        return self.done[name]

    def reference(self, arch: str) -> Run:
        return self._train(f"tp1-{arch}", 1, arch, *REFERENCE)

    def layout(self, name: str) -> Run:
        layout = LAYOUTS[name]
        return self._train(name, layout.nproc, layout.arch, *layout.args)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("parity"))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_same_losses_as_one_process(runs, layout):
    reference = runs.reference(LAYOUTS[layout].arch)
    run = runs.layout(layout)
    assert len(run.losses) == len(reference.losses) == STEPS
    diffs = [abs(a - b) for a, b in zip(run.losses, reference.losses, strict=True)]
    saved = re.search(SAVED, run.output)
    print(
        f"{layout}: {run.seconds:.1f} s; losses {run.losses} vs tp1 {reference.losses}; "
        f"max diff {max(diffs):.2e}; saved activations {saved and saved.group(1)} MiB"
    )
    assert max(diffs) <= TOLERANCE
    assert reference.losses[-1] < reference.losses[0]  # the runs do train


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_same_grad_norm_as_one_process(runs, layout):
    """The logged (and clipping) gradient norm is exact: every layout's equals one
    process's at every step to 1e-6 relative, as fp64 sums of fp32 gradients do."""
    reference = runs.reference(LAYOUTS[layout].arch).grad_norms
    got = runs.layout(layout).grad_norms
    errors = [abs(a - b) / b for a, b in zip(got, reference, strict=True)]
    print(f"{layout}: grad norms {got} vs tp1 {reference}; max relative diff {max(errors):.2e}")
    assert len(got) == STEPS and max(errors) <= GRAD_NORM_TOLERANCE


def _saved_mib(run: Run) -> float:
    """The saved-activation size in the run's summary line (checked against the line
    logged after step 1)."""
    summaries = re.findall(r"Summary: .*" + SAVED, run.output)
    logged = re.findall(SAVED, run.output)  # after step 1 and in the summary
    assert len(summaries) == 1 and logged == summaries * 2, run.output[-3000:]
    return float(summaries[0])


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_same_validation_loss_as_one_process(runs, layout):
    """Every layout validates at its last step, and the summary line carries it; its
    held-out loss is the one-process run's up to the training drift."""
    reference = runs.reference(LAYOUTS[layout].arch).validation
    run = runs.layout(layout)
    assert list(run.validation) == list(reference) == [STEPS]
    got, expected = run.validation[STEPS], reference[STEPS]
    diff = abs(got["validation_loss"] - expected["validation_loss"])
    print(f"{layout}: validation {got} vs tp1 {expected}; diff {diff:.2e}")
    assert got["validation_tokens"] == expected["validation_tokens"] == runs.validation_tokens
    assert diff <= TOLERANCE
    summary = rf"Summary: .*validation loss {got['validation_loss']:.4f} \(step {STEPS}\)"
    assert re.search(summary, run.output)


def test_summary_reports_saved_activations(runs):
    """The summary line shows step 1's saved activations; low-rank AC saves less (PP 2 x
    TP 2, with and without it)."""
    full = _saved_mib(runs.layout("pp2-tp2"))
    lowrank = _saved_mib(runs.layout("lowrank_ac-pp2-tp2"))
    print(f"pp2-tp2: saved activations {full} MiB, with lowrank_ac {lowrank} MiB")
    assert 0 < lowrank < full


def test_trainer_starts_from_export(runs):
    """The seed checkpoint, exported by `python -m boost_titan.export`, holds the model's
    tensors bit for bit, and BTP TP=2 trains from the export exactly as from the checkpoint
    (tp2-btp): the same losses and grad norms (`tests/unit/test_export.py`: the one-process
    export and import tests)."""
    step0, out = runs.seed("cola"), runs.root / "export"
    result = run_module(
        "boost_titan.export", "--checkpoint", str(step0), "--out", str(out), "--arch", "cola"
    )
    assert result.returncode == 0, result.stderr
    assert f"-> {out}/model.safetensors" in result.stdout and "initial_load_in_hf" in result.stdout
    saved = checkpoint_weights(step0, runs.root)  # the model's tensors (no optimizer etc.)
    with safe_open(out / "model.safetensors", framework="pt") as f:
        assert set(f.keys()) == set(saved)
        assert all(bits_equal(f.get_tensor(k), saved[k]) for k in saved)
    assert all(bits_equal(v, saved[k]) for k, v in load_model_state(str(step0)).items())

    from_dcp = runs.layout("tp2-btp")
    hf = ("--checkpoint.initial_load_in_hf",)
    from_export = runs._train(
        "tp2-btp-from-export", 2, "cola", *LAYOUTS["tp2-btp"].args, *hf, start=str(out)
    )
    print(f"losses from DCP {from_dcp.losses}, from export {from_export.losses}")
    assert from_export.losses == from_dcp.losses
    assert from_export.grad_norms == from_dcp.grad_norms


RESHARDED = {
    "tp2-btp": Layout(2, (*TP2, *_batch(4))),
    "tp1": Layout(1, REFERENCE),
    "tp4-btp": Layout(4, ("--parallelism.tensor_parallel_degree", "4", *_batch(4))),
    "tp2-vanilla": Layout(2, (*TP2, "--boost.tp_strategy", "vanilla", *_batch(4))),
    "fsdp2": Layout(2, ("--parallelism.tensor_parallel_degree", "1", *DP2, *_batch(2))),
    "pp2": Layout(
        2, ("--parallelism.tensor_parallel_degree", "1", *pipeline_args("1F1B", 2), *_batch(4))
    ),
    "cp2-tp2": LAYOUTS["cp2-tp2"],
}


@pytest.fixture(scope="module")
def resharded_losses(runs) -> dict[str, float]:
    """The first loss of each layout loading the checkpoint that tp2-btp saved at its
    last step (each starts from the first global batch, so the loss depends on the weights only).

    The step runs at learning rate 0, so AdamW leaves every weight as loaded (its update
    and weight decay are scaled by the LR) and the model-only checkpoint each layout saves
    after it is the state it loaded, gathered by DCP (`test_resharded_state_dict_is_identical`)."""
    losses = {"untrained": runs.layout("tp2-btp").losses[0]}
    for name, layout in RESHARDED.items():
        losses[name] = _step_at_lr0(runs, f"resharded-{name}", layout, _trained(runs))
    return losses


def _step_at_lr0(runs: Runs, name: str, layout: Layout, checkpoint: Path) -> float:
    """The loss of one step at learning rate 0 of `layout` from `checkpoint` (its model
    saved after the step into `name`'s dump folder)."""
    at = runs.common.index("--training.steps")
    common = runs.common[:at] + runs.common[at + 2 :]
    dump = runs.root / name
    _torchrun(
        layout.nproc,
        dump,
        *common,
        "--training.steps",
        "1",
        "--checkpoint.enable",
        "--checkpoint.initial_load_path",
        str(checkpoint),
        "--optimizer.lr",
        "0",
        "--checkpoint.last_save_model_only",
        *layout.args,
    )
    [loss] = _losses(dump)
    return loss


def _trained(runs: Runs) -> Path:
    """The full checkpoint tp2-btp saved at its last step."""
    return runs.root / "tp2-btp" / "checkpoint" / f"step-{STEPS}"


@pytest.mark.parametrize("layout", [name for name in RESHARDED if name != "tp2-btp"])
def test_btp_checkpoint_loads_under_other_layouts(resharded_losses, layout):
    """A BTP TP=2 checkpoint loads under TP=1, TP=4, vanilla TP=2, FSDP only and PP=2: the
    same model, so the same next-step loss."""
    same = resharded_losses["tp2-btp"]
    print(f"{layout}: loss {resharded_losses[layout]} vs tp2-btp {same}")
    assert abs(resharded_losses[layout] - same) <= TOLERANCE
    assert same < resharded_losses["untrained"] - 1.0  # the trained weights were loaded


@pytest.mark.parametrize("layout", list(RESHARDED))
def test_resharded_state_dict_is_identical(runs, resharded_losses, layout):
    """Each layout's full model state dict after loading the BTP TP=2 checkpoint (saved by
    it after a step at LR 0, read back whole in one process) equals the TP=2 checkpoint's
    bit for bit: same keys, shapes, dtypes and bytes."""
    saved = load_model_state(str(_trained(runs)))
    loaded = load_model_state(str(runs.root / f"resharded-{layout}" / "checkpoint" / "step-1"))
    assert loaded.keys() == saved.keys()
    differing = [
        key
        for key, tensor in saved.items()
        if tensor.dtype != loaded[key].dtype
        or tensor.shape != loaded[key].shape
        or not torch.equal(tensor.view(torch.uint8), loaded[key].view(torch.uint8))
    ]
    print(f"{layout}: {len(saved)} tensors, {len(differing)} differ from tp2-btp's checkpoint")
    assert not differing, differing[:5]


@pytest.fixture(scope="module")
def resharded_validation(runs, resharded_losses) -> dict[str, float]:
    """The held-out loss each resharded run logged after its step at LR 0: one set of
    weights (tp2-btp's checkpoint) validated under each layout."""
    rows = {name: _validations(runs.root / f"resharded-{name}")[1] for name in RESHARDED}
    assert all(row["validation_tokens"] == runs.validation_tokens for row in rows.values())
    return {name: row["validation_loss"] for name, row in rows.items()}


@pytest.mark.parametrize("layout", [name for name in RESHARDED if name != "tp1"])
def test_same_weights_same_validation_loss(resharded_validation, layout):
    """BTP TP=2 (and TP=4, vanilla TP=2, FSDP, PP=2) validating the weights one process
    validates report its held-out loss to 1e-5 (fp32)."""
    one, got = resharded_validation["tp1"], resharded_validation[layout]
    print(f"{layout}: validation loss {got} vs tp1 {one}; diff {abs(got - one):.2e}")
    assert abs(got - one) <= SAME_WEIGHTS_TOLERANCE


def _eval_torchrun(nproc: int, *args: str) -> dict:
    """`python -m boost_titan.eval` under torchrun; its JSON result."""
    cmd = torchrun_command(nproc, "boost_titan.eval", args, rank0_only=False)
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_eval_reports_the_validation_loss(runs, resharded_validation):
    """`boost_titan.eval` on that checkpoint and validation data, on one process and under
    torchrun with BTP TP=2, reports what the validators logged (to 1e-5)."""
    args = [
        "--checkpoint",
        str(_trained(runs)),
        "--arch",
        "cola",
        "--dataset-path",
        str(runs.validation_data),
        "--seq-len",
        str(runs.seq_len),
        "--batch-size",
        "4",
        "--steps",
        str(VALIDATION_STEPS),
    ]
    results = {
        "eval": evaluate_trained(parser().parse_args(args)),
        "eval-tp2": _eval_torchrun(2, *args),
    }
    assert results["eval-tp2"]["tp"] == 2
    for name, result in results.items():
        assert result["tokens"] == runs.validation_tokens
        for layout in ("tp1", "tp2-btp"):
            diff = abs(result["loss"] - resharded_validation[layout])
            print(f"{name}: loss {result['loss']} vs {layout}'s validation: diff {diff:.2e}")
            assert diff <= SAME_WEIGHTS_TOLERANCE


# ---- bf16 compute (mixed_precision_param bfloat16) -------------------------------------
BF16_STEPS = 3
BF16 = (
    "--training.mixed_precision_param",
    "bfloat16",
    "--training.steps",
    str(BF16_STEPS),
    "--validation.no_enable",
)
BF16_LAYOUTS = {  # bf16 layout -> (its fp32 run: same seed, data and layout, STEPS steps)
    "tp1-bf16": ("tp1-cola", Layout(1, (*REFERENCE, *BF16))),
    "tp2-bf16": ("tp2-btp", Layout(2, (*LAYOUTS["tp2-btp"].args, *BF16))),
    "pp2-tp2-bf16": ("pp2-tp2", Layout(4, (*LAYOUTS["pp2-tp2"].args, *BF16))),
    "dp2-tp2-bf16": ("dp2-tp2", Layout(4, (*LAYOUTS["dp2-tp2"].args, *BF16))),
}
BF16_ON = 10
"""bf16 is on when a run differs from its fp32 twin by more than BF16_ON x the fp32 layouts'
own tolerances (TOLERANCE, GRAD_NORM_TOLERANCE) at some step."""
BF16_SPREAD = 4
"""Tolerance of a bf16 layout against bf16 TP1, in units of D = TP1's largest bf16-vs-fp32
difference over the steps (loss; relative grad norm). Derivation: a layout's bf16 result is
the fp32 one (equal in every layout to 1e-5 / 1e-6) plus its rounding error e. At TP1 each
GEMM output is rounded to bf16 once (unit roundoff u = 2^-8); under TP a partial sum is
rounded, then the all-reduced sum again, so e_X's deviation is at most sqrt(3) x TP1's, s,
and |e_X - e_TP1| deviates by at most sqrt(3 + 1) s = 2 s (less where both share an error,
as the bf16 copy of the same weights). D, the largest of three |e_TP1|, is 1.33 s on
average, so 4 D is 5.3 s, 2.6 deviations: a correct layout exceeds it with probability
< 1%. Measured on CPU: D = 1.2e-3 (loss) and 1.3e-3 (grad norm); the layouts' largest
differences from bf16 TP1 are 5.5e-4 (0.5 D) and 1.3e-3 (1.0 D), against largest loss
differences of 1.2e-3 to 1.6e-3 from fp32. A wrong factor or a dropped term in a layout's
gradients moves its grad norm by far more than u."""


def _bf16_run(runs: Runs, name: str) -> tuple[Run, Run]:
    """(the bf16 run, its fp32 twin's run); both memoized."""
    twin, layout = BF16_LAYOUTS[name]
    fp32 = runs.reference("cola") if twin == "tp1-cola" else runs.layout(twin)
    return runs._train(name, layout.nproc, layout.arch, *layout.args), fp32


def _deviations(run: Run, other: Run) -> tuple[list[float], list[float]]:
    """Per step: |loss difference| and relative grad-norm difference (exact fp64 norms)."""
    steps = range(BF16_STEPS)
    return (
        [abs(run.losses[s] - other.losses[s]) for s in steps],
        [abs(run.grad_norms[s] - other.grad_norms[s]) / other.grad_norms[s] for s in steps],
    )


@pytest.mark.parametrize("layout", list(BF16_LAYOUTS))
def test_bf16_differs_from_fp32_and_agrees_with_bf16_tp1(runs, layout):
    """From one seed checkpoint, 3 bf16 steps at TP1, TP2, PP2 x TP2 and FSDP2 x TP2: each
    differs from its fp32 twin (bf16 is on: a layout silently computing in fp32 would equal
    it to 1e-5) and agrees with bf16 TP1 within BF16_SPREAD x TP1's own bf16 deviation."""
    run, fp32 = _bf16_run(runs, layout)
    tp1, tp1_fp32 = _bf16_run(runs, "tp1-bf16")
    assert len(run.losses) == len(run.grad_norms) == BF16_STEPS
    loss_off, grad_off = _deviations(run, fp32)
    loss_d, grad_d = (max(d) for d in _deviations(tp1, tp1_fp32))
    loss_to_tp1, grad_to_tp1 = _deviations(run, tp1)
    print(
        f"{layout} ({run.seconds:.0f} s): bf16 vs fp32 loss {loss_off}, grad norm {grad_off}; "
        f"vs bf16 tp1 loss {loss_to_tp1}, grad norm {grad_to_tp1}; tp1's bf16 deviation "
        f"D = {loss_d:.2e} (loss), {grad_d:.2e} (grad norm)"
    )
    assert max(loss_off) > BF16_ON * TOLERANCE and max(grad_off) > BF16_ON * GRAD_NORM_TOLERANCE
    assert "Precision: bf16 compute, fp32 master weights and gradient reductions" in run.output
    assert "Precision: fp32\n" in fp32.output
    for titan in ("Mixed precision training", "only supported when FSDP"):  # maybe_enable_amp's
        assert titan not in run.output + fp32.output
    assert max(loss_to_tp1) <= BF16_SPREAD * loss_d and max(grad_to_tp1) <= BF16_SPREAD * grad_d


CP_RESUMED = ("cp2-tp2", "tp1", "tp2-btp")


@pytest.fixture(scope="module")
def cp_resumed_losses(runs) -> dict[str, float]:
    """The next loss (one step at LR 0) of CP 2 x TP 2, one process and BTP TP 2 from the
    checkpoint cp2-tp2 saved at its last step."""
    checkpoint = runs.root / "cp2-tp2" / "checkpoint" / f"step-{STEPS}"
    runs.layout("cp2-tp2")
    return {
        name: _step_at_lr0(runs, f"cp-resumed-{name}", RESHARDED[name], checkpoint)
        for name in CP_RESUMED
    }


@pytest.mark.parametrize("layout", CP_RESUMED[1:])
def test_cp_checkpoint_resumes_without_cp(runs, cp_resumed_losses, layout):
    """A CP 2 x TP 2 checkpoint resumes at CP 1 (one process, BTP TP 2) with the next loss
    CP 2 x TP 2 computes from it."""
    same = cp_resumed_losses["cp2-tp2"]
    print(f"{layout}: loss {cp_resumed_losses[layout]} vs cp2-tp2 {same}")
    assert abs(cp_resumed_losses[layout] - same) <= TOLERANCE
    assert same < runs.layout("cp2-tp2").losses[0] - 1.0  # the trained weights were loaded
