"""Validate a training job in one process, without process groups: the library behind
`python -m boost_titan.check`, also run by `bench step` and priced by `bench model --config`.

`check` takes the same arguments as `boost_titan.train`. The process count comes from `--nproc`,
else the NGPU environment variable, else the smallest count the parallel degrees allow.
Besides the configuration it opens what the job will read: a sample of every local
dataset file, and the DCP metadata and files of the checkpoint it will load (the newest
in the dump folder, else `checkpoint.initial_load_path`), whose pickles it unpickles
through the checkpoint allowlist (one that asks for anything else is refused, and nothing
of it runs) and whose weights must be the job's model's (names and shapes, from the
metadata alone); it checks that no other job holds the dump folder, and prepares the
default tokenizer once, before workers start.

`check` parses train's arguments once and runs `check_job` on the result, which returns the
`config ok: ...` summary; they raise ConfigError for bad input and NothingToTrain (`nothing
to train: ...`) when the dump folder's checkpoint is already at training.steps. The training
workers run in other processes (torchrun's) and re-run the checks they need themselves
(`boost_titan.job.entry`).
"""

from __future__ import annotations

import os
import tempfile

from boost_titan.checkpoint.files import (
    check_loadable,
    is_complete_checkpoint,
    misnamed_step,
    newest_step,
    read_metadata,
)
from boost_titan.config import check_cuda_graphs, check_documents, check_run_limits
from boost_titan.config.bounds import check_bounds
from boost_titan.config.errors import ConfigError
from boost_titan.config.optimizer import check_optimizer
from boost_titan.config.precision import Precision
from boost_titan.config.titan_settings import check_titan_settings
from boost_titan.config.world import check_batch, resolve_world
from boost_titan.job.families import family_of
from boost_titan.runtime.dump_lock import DumpFolderLock


def check_output_folder(folder: str) -> None:
    """Prove a file can be written in `folder` (created for the test and removed again if
    it did not exist) and that no other job holds it (`DumpFolderLock`)."""
    made = _missing_ancestors(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ConfigError(
            f"output folder {folder} is not writable ({reason}); "
            "set --job.dump_folder to a writable path"
        ) from None
    finally:
        for path in made:  # deepest first; a folder someone filled meanwhile stays
            try:
                os.rmdir(path)
            except OSError:
                break
    if not made:
        DumpFolderLock(folder).probe()


def _missing_ancestors(folder: str) -> list[str]:
    """`folder` and its ancestors that do not exist yet, deepest first."""
    missing, path = [], os.path.abspath(folder)
    while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def check_model(job, world: int, data_parallel: int) -> tuple[int | None, Shapes]:
    """Prepare default assets, let the job's model family (`job.families`) validate model x
    parallelism, and build what the worker builds before training (`job.construction`:
    the model on the meta device for every TrainSpec; the tokenizer and dataloaders of
    one of no family of ours, which reads TorchTitan's data); return the vocabulary size
    of a family's model (None for another TrainSpec) and the model's state-dict shapes."""
    import boost_titan.data
    from boost_titan.data.held_out import point_titan_validation_at_held_out
    from boost_titan.job.construction import build_model, build_titan_data, flavor_args, train_spec

    spec = train_spec(job)
    boost_titan.data.prepare_default_assets()
    family = family_of(job)
    if family is not None:
        family.validate_job(job, world)
    args = flavor_args(spec, job)
    if family is None:
        point_titan_validation_at_held_out(job)  # as the worker does
        build_titan_data(spec, args, job, data_parallel)
    model = build_model(spec, args, job)
    shapes = {key: tuple(t.shape) for key, t in model.state_dict().items()}
    return (None if family is None else family.vocab_size(job)), shapes


LARGE_RAW_CORPUS = 1 << 30
"""Raw training files past this many bytes get a pointer to `prepare` in the summary."""


def check_data(job) -> str:
    """A local dataset must exist, hold non-empty files of a supported kind, and each file's
    start must decode as the loader reads it; prepared datasets (`training.dataset_path`
    or `[boost] data_mix`) must have a readable manifest and whole shards. Returns a note
    for the summary ("", a pointer to `prepare` for a large raw corpus, or a warning line
    when prepared data needs more open files than the soft limit allows)."""
    from boost_titan.data.corpus import local_files, resolve_dataset
    from boost_titan.data.document_masks import asked, end_token
    from boost_titan.data.megatron_indexed import MegatronDataset
    from boost_titan.data.mix import open_sources, training_sources
    from boost_titan.data.prepared_check import open_files_note
    from boost_titan.data.probe import probe_files

    sources = training_sources(job.training, job.boost)
    if sources is not None:
        opened = open_sources(sources)
        named = [d.tokenizer for d in opened if not isinstance(d, MegatronDataset)]
        if asked(job.boost) and named:  # a Megatron source's is the tokenizer's, as raw data's
            end_token(named, "the prepared data")
        return open_files_note(opened)
    _, path = resolve_dataset(job.training.dataset, job.training.dataset_path)
    if not path:
        return ""
    files = local_files(path)
    probe_files(files)
    size = sum(f.stat().st_size for f in files)
    if size <= LARGE_RAW_CORPUS:
        return ""
    return (
        f"; note: {path} holds {size / 2**30:.1f} GiB of raw text, tokenized by every rank on "
        "the fly: tokenize it once with python -m boost_titan.prepare (docs/datasets.md)"
    )


def resume_checkpoint(job) -> str | None:
    """The step-N folder the job resumes from, as TorchTitan picks it: with checkpointing on
    and the dump folder's checkpoint folder present, `checkpoint.load_step` or the newest
    complete one. None: the job starts from scratch or `checkpoint.initial_load_path`."""
    c = job.checkpoint
    folder = os.path.join(job.job.dump_folder, c.folder)
    if not c.enable or not os.path.exists(folder):
        return None
    step = newest_step(folder) if c.load_step == -1 else c.load_step
    if step < 0:
        return None
    problem = misnamed_step(folder, step)
    if problem:
        raise ConfigError(problem)
    path = os.path.join(folder, f"step-{step}")
    if not is_complete_checkpoint(path):
        raise ConfigError(
            f"checkpoint.load_step {c.load_step}: {path} is not a complete checkpoint; choose "
            f"a step saved in {folder}, or -1 for the newest"
        )
    return path


def check_resume(job) -> int | None:
    """The step the job resumes from (None: it does not), after checking that its
    checkpoint can be read."""
    path = resume_checkpoint(job)
    folder = os.path.join(job.job.dump_folder, job.checkpoint.folder)
    initial = job.checkpoint.initial_load_path
    if path is None and initial and job.checkpoint.enable and os.path.exists(folder):
        raise ConfigError(
            f"checkpoint.initial_load_path {initial} would be ignored: {folder} exists without a "
            "complete checkpoint, and TorchTitan then starts from scratch; delete that folder "
            "to start from the initial checkpoint"
        )
    if path is None:
        return None
    check_loadable(path, resuming=True)
    return int(os.path.basename(path).removeprefix("step-"))


def check_initial_checkpoint(job) -> None:
    """`checkpoint.initial_load_path` must be a complete DCP checkpoint folder, or with
    `initial_load_in_hf` a folder written by `python -m boost_titan.export` (the family's
    export format)."""
    checkpoint = job.checkpoint
    path = checkpoint.initial_load_path
    if path and not checkpoint.enable:
        raise ConfigError(
            f"checkpoint.initial_load_path {path} is ignored while checkpoint.enable is false "
            "(training would start from scratch); add --checkpoint.enable"
        )
    if checkpoint.initial_load_in_hf:
        if not path:
            raise ConfigError(
                "checkpoint.initial_load_in_hf needs checkpoint.initial_load_path; point it at "
                "a folder written by python -m boost_titan.export"
            )
        if not checkpoint.initial_load_model_only:
            raise ConfigError(
                "checkpoint.initial_load_in_hf loads model weights only; drop "
                "--checkpoint.no_initial_load_model_only"
            )
        family = family_of(job)
        if family is not None:
            family.check_export_folder(path)
        return
    if not path:
        return
    if not os.path.isdir(path):
        raise ConfigError(
            f"checkpoint.initial_load_path {path} is not a folder; point it at a step-N "
            "checkpoint folder"
        )
    if not is_complete_checkpoint(path):
        if os.path.isfile(os.path.join(path, "model.safetensors")):
            raise ConfigError(
                f"checkpoint.initial_load_path {path} is an export (model.safetensors), not a "
                "DCP checkpoint; add --checkpoint.initial_load_in_hf"
            )
        raise ConfigError(
            f"checkpoint.initial_load_path {path} has no DCP .metadata (incomplete or not a "
            "checkpoint); use a complete step-N folder"
        )


Shapes = dict[str, tuple[int, ...]]
"""A model's state-dict keys and their shapes."""


def _saved_with(job) -> str:
    """What a checkpoint of another model was saved with, to train with instead."""
    family = family_of(job)
    return (
        "the model.name and model.flavor it was saved with" if family is None else family.saved_with
    )


def _job_model(job) -> str:
    """The job's model as the mismatch line names it."""
    family = family_of(job)
    return f"{job.model.name} {job.model.flavor}" if family is None else family.describe(job)


def check_holds_model(job, metadata, where: str, fix: str, expected: Shapes) -> None:
    """A DCP checkpoint (its `metadata`: keys and shapes, nothing else is read) holds the
    job's model: every weight, with the same shape, and no other weight (TorchTitan would
    stop with a traceback on a missing one and silently drop an extra one)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torchtitan.components.checkpoint import DATALOADER, LR_SCHEDULER, OPTIMIZER, TRAIN_STATE

    training_state = {DATALOADER, LR_SCHEDULER, OPTIMIZER, TRAIN_STATE}
    stored = {
        key: tuple(meta.size)
        for key, meta in metadata.state_dict_metadata.items()
        if key.split(".")[0] not in training_state and isinstance(meta, TensorStorageMetadata)
    }
    key = next(
        (k for k in sorted(expected.keys() | stored.keys()) if expected.get(k) != stored.get(k)),
        None,
    )
    if key is not None:
        raise ConfigError(
            f"{where} has {key} {stored.get(key, 'missing')} but the job's model "
            f"({_job_model(job)}) expects {expected.get(key, 'no such weight')}; {fix}"
        )


def check_checkpoint_model(job, expected: Shapes) -> None:
    """The DCP checkpoint the job loads holds the job's model (`check_holds_model`): the
    one it resumes from (already checked readable), else `checkpoint.initial_load_path`,
    which must also open (its metadata unpickles and every file it names is whole)."""
    resume = resume_checkpoint(job)
    if resume is not None:
        where = f"the checkpoint to resume from, {resume},"
        fix = (
            f"set --job.dump_folder to a new folder for this model, or train with "
            f"{_saved_with(job)}"
        )
        check_holds_model(job, read_metadata(resume, where), where, fix, expected)
        return
    checkpoint = job.checkpoint
    path = checkpoint.initial_load_path
    if path and checkpoint.enable and not checkpoint.initial_load_in_hf:
        where = f"checkpoint.initial_load_path {path}"
        metadata = check_loadable(path, resuming=False)
        check_holds_model(job, metadata, where, f"train with {_saved_with(job)}", expected)


def check_initial_export(job) -> None:
    """An export given with `initial_load_in_hf` must hold exactly the job's model."""
    family = family_of(job)
    if job.checkpoint.initial_load_in_hf and family is not None:
        family.check_initial_export(job)


def _our_model(job) -> str:
    """` (arch, tp_strategy auto -> btp)` for a model of our families; TorchTitan's and
    users' models have no arch or strategy of ours: said so."""
    family = family_of(job)
    if family is None:
        return " (no family of boost_titan: TorchTitan's construction checks only)"
    return family.layout(job)


def _count_source(nproc: int | None) -> str:
    """Where the process count came from, when no one gave it."""
    if nproc is not None:
        return ""
    return "; the count [parallelism] implies, no --nproc or NGPU given"


class NothingToTrain(Exception):
    """The job's checkpoint is already at training.steps; the message says so."""


def check_job(job, nproc: int | None) -> str:
    """Validate the parsed job `job` on `nproc` processes (None: NGPU, else the fewest the
    degrees allow); return the `config ok` summary. Raises ConfigError for bad input and
    NothingToTrain for a finished job."""
    world, degrees = resolve_world(job, nproc)
    batch = check_batch(job, degrees)
    check_run_limits(job.boost)
    check_cuda_graphs(job.boost, degrees["pp"])
    check_documents(job.boost, job.model.name, job.parallelism)
    check_titan_settings(job)
    check_optimizer(job)
    check_bounds(job)
    check_output_folder(job.job.dump_folder)
    data_note = check_data(job)
    check_initial_checkpoint(job)
    resumed = check_resume(job)
    vocab, shapes = check_model(job, world, degrees["dp_replicate"] * degrees["dp_shard"])
    from boost_titan.data.prepared_check import check_prepared  # numpy: not for --help

    check_prepared(job, vocab, scan_ids=True)  # prepared data: the tokenizer's, in `vocab`
    check_checkpoint_model(job, shapes)
    check_initial_export(job)
    if resumed is not None and resumed >= job.training.steps:
        raise NothingToTrain(
            f"nothing to train: already at step {resumed} ({resume_checkpoint(job)}) and "
            f"training.steps is {job.training.steps}; raise --training.steps to continue, or "
            "set --job.dump_folder to a new folder to start over"
        )
    layout = " x ".join(f"{k} {v}" for k, v in degrees.items() if v > 1) or "no parallelism"
    start = f", resumes from step {resumed}" if resumed is not None else ""
    fsdp = degrees["dp_shard"] > 1 or degrees["cp"] > 1
    precision = Precision.of(job.training).describe(fsdp=fsdp)
    return (
        f"config ok: {job.model.name} {job.model.flavor}{_our_model(job)} "
        f"on {world} process{'es' if world > 1 else ''} ({layout}{_count_source(nproc)}), "
        f"{precision}, {f'vocab {vocab}, ' if vocab else ''}"
        f"global batch {batch} x seq_len {job.training.seq_len}, "
        f"{job.training.steps} steps{start}, "
        f"outputs in {job.job.dump_folder}{data_note}"
    )
