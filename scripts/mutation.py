"""Mutation check of the parallel code: every mutant of `parallelize/` and `kernels/` must
make the quick equivalence tests fail.

    .venv/bin/python scripts/mutation.py              # every mutant; a markdown table at the end
    .venv/bin/python scripts/mutation.py --only 3,7   # some of them
    .venv/bin/python scripts/mutation.py --list       # the table of mutants, nothing run

Each mutant is one textual change to one file (the text must occur exactly once). The
repository's files (tracked, and untracked ones git does not ignore) are copied once into a
temporary folder, with
`boost_titan/parallelize` and `boost_titan/kernels` linked to the copies of `parallelize/`
and `kernels/` (as the installed package maps them); each mutant is written there and
`TESTS` run in a subprocess with the copy first on `sys.path`, stopping at the first
failure, which is reported as the test that killed the mutant. Exit status 1 if a mutant
survives. The working tree is never modified. Not part of CI (about a minute per mutant
on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TESTS = [
    "tests/unit/test_collectives.py",
    "tests/unit/test_kernels.py",
    "tests/unit/test_lowrank_ac.py::test_last_gemm_into_a_residual_add_is_not_recomputed",
    "tests/unit/test_plan_reuse.py",
    "tests/unit/test_group_activation.py",
    "tests/distributed/test_plan_reuse.py",
    "tests/distributed/test_tp_equivalence.py",
    "tests/distributed/test_lowrank_ac.py::test_tp_identical_and_no_replayed_collectives",
]
"""Cheap and single-process first; the multi-process equivalence tests at TP 2 and 4 last."""


@dataclass(frozen=True)
class Mutant:
    path: str
    old: str
    new: str
    breaks: str


M = Mutant
MUTANTS = [
    # ---- comm: collectives and their autograd ------------------------------------------
    M(
        "parallelize/comm.py",
        "return _wait(_start_all_reduce(x, group))",
        "return x.contiguous()",
        "drop every all-reduce",
    ),
    M(
        "parallelize/comm.py",
        "return _wait(_start_all_reduce(x, group))",
        'return _wait(_OPS.all_reduce(x.contiguous(), "avg", group.group_name))',
        "wrong reduce op (avg)",
    ),
    M(
        "parallelize/comm.py",
        "blocks = [_wait(block) for block in reduced]",
        "blocks = [grad_x_of(a, b) for a, b in row_blocks(rows[0].shape[0], ctx.chunks)]",
        "column-parallel input grad not all-reduced",
    ),
    M(
        "parallelize/comm.py",
        "float8.weight_grad(g, x_p, f8) if needed else None",
        "2 * float8.weight_grad(g, x_p, f8) if needed else None",
        "column-parallel weight grad scaled by 2",
    ),
    M(
        "parallelize/comm.py",
        "        return _all_reduce(grad, ctx.group), None\n\n\nclass WeightGradStash",
        "        return grad, None\n\n\nclass WeightGradStash",
        "sync statistic's grad not all-reduced",
    ),
    M(
        "parallelize/comm.py",
        "        return _reduce_scatter_last(grad, ctx.group), None",
        "        return _own_slice(grad, ctx.group), None",
        "all-gather's backward keeps a slice instead of reduce-scatter",
    ),
    M(
        "parallelize/comm.py",
        "return x.narrow(-1, rank * chunk, chunk).contiguous()",
        "return x.narrow(-1, (rank + 1) % size * chunk, chunk).contiguous()",
        "wrong shard offset",
    ),
    M(
        "parallelize/comm.py",
        "        return _wait(reduced), None, None, None, *grads_w",
        "        return grad, None, None, None, *grads_w",
        "deferred group grad not all-reduced",
    ),
    M(
        "parallelize/comm.py",
        "grads_w.append(float8.weight_grad(*entry) if needed and entry is not None else None)",
        "grads_w.append(2 * float8.weight_grad(*entry) if needed and entry is not None else None)",
        "deferred weight grads scaled by 2",
    ),
    M(
        "parallelize/comm.py",
        "            ctx.stash.entries[ctx.index] = (grad, x, ctx.f8)",
        "            pass",
        "deferred weight grad dropped",
    ),
    M(
        "parallelize/comm.py",
        "        return grad, None\n\n\nclass _ColumnLinears",
        "        return grad.detach() * 0, None\n\n\nclass _ColumnLinears",
        "row-parallel output grad path detached",
    ),
    # ---- norms: online and sync RMSNorm -------------------------------------------------
    M(
        "parallelize/norms.py",
        "float8.weight_grad(g, tokens, f8) * weight\n",
        "float8.weight_grad(g, tokens, f8)\n",
        "norm weight dropped from the down grads",
    ),
    M(
        "parallelize/norms.py",
        "float8.weight_grad(g, tokens, f8) * weight\n",
        "float8.weight_grad(g, tokens, f8) * weight * weight\n",
        "norm weight squared in the down grads",
    ),
    M(
        "parallelize/norms.py",
        "inv_rms = torch.rsqrt(first[..., -1:].float() / dim + eps)",
        "inv_rms = torch.rsqrt(first[..., -1:].float() / dim + 10 * eps)",
        "wrong eps (online)",
    ),
    M(
        "parallelize/norms.py",
        "ys = [first[..., :-1]]",
        "ys = [first[..., 1:]]",
        "statistic taken one element off",
    ),
    M(
        "parallelize/norms.py",
        "inv_rms = torch.rsqrt(first[..., -1:].float() / dim + eps)",
        "inv_rms = torch.rsqrt(first[..., -1:].float() / (dim - 1) + eps)",
        "mean over d - 1 features",
    ),
    M(
        "parallelize/norms.py",
        "coef = (inv_rms.pow(2) / ctx.dim) * grad_dot_out",
        "coef = (inv_rms.pow(2) / ctx.dim) * grad_dot_out * 0",
        "statistic's term dropped from dx",
    ),
    M(
        "parallelize/norms.py",
        "        return grad_x, grad_weight, None, None, None, None, None, *grad_downs",
        "        return None, grad_weight, None, None, None, None, None, *grad_downs",
        "input grad path detached",
    ),
    M(
        "parallelize/norms.py",
        "sum_sq = sum_both(x.float().pow(2).sum(-1, keepdim=True), group)",
        "sum_sq = x.float().pow(2).sum(-1, keepdim=True) * group.size()",
        "sync statistic not all-reduced",
    ),
    # ---- kernels (the torch references run on CPU; the Triton ones under the interpreter)
    M(
        "kernels/rmsnorm.py",
        "return (xf * weight.float()).to(x.dtype), xf.pow(2).sum(-1, keepdim=True)",
        "return (xf * weight.float()).to(x.dtype), xf.abs().sum(-1, keepdim=True)",
        "sum of |x| for sum of squares",
    ),
    M(
        "kernels/rmsnorm.py",
        "grad_x = (weight.float() * gf - coef.float() * xf).to(x.dtype)",
        "grad_x = (weight.float() * gf + coef.float() * xf).to(x.dtype)",
        "sign of the statistic's term",
    ),
    M(
        "kernels/rmsnorm.py",
        "grad_weight = (gf * xf).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)",
        "grad_weight = gf.reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)",
        "norm weight grad without x",
    ),
    M(
        "kernels/_rmsnorm_triton.py",
        "scaled = (x * w[None, :])",
        "scaled = (x * w[None, :] * w[None, :])",
        "Triton: norm weight squared",
    ),
    M(
        "kernels/_rmsnorm_triton.py",
        "acc += tl.sum(x * x, axis=1)",
        "acc += tl.sum(x, axis=1)",
        "Triton: sum of x for sum of squares",
    ),
    M(
        "kernels/_rmsnorm_triton.py",
        "acc += tl.sum(g * x, axis=0)",
        "acc += tl.sum(g, axis=0)",
        "Triton: norm weight grad without x",
    ),
    # ---- styles and groups -------------------------------------------------------------
    M(
        "parallelize/styles.py",
        "y = comm.row_linear(x, weight, group, self.overlap_chunks, self.f8())",
        "y = F.linear(x, weight)",
        "row-parallel output not all-reduced",
    ),
    M(
        "parallelize/styles.py",
        "return comm.gather_last_reduce_scatter_grad(y, group) if self.gather_output else y",
        "return comm.gather_last(y, group) if self.gather_output else y",
        "final gather's backward not reduce-scattered",
    ),
    M(
        "parallelize/styles.py",
        'placements = {"weight": Shard(0), "bias": Shard(0)}\n\n    def __init__(\n'
        "        self,\n        *,\n        reduce_input_grad",
        'placements = {"weight": Shard(0), "bias": Replicate()}\n\n    def __init__(\n'
        "        self,\n        *,\n        reduce_input_grad",
        "column-parallel bias replicated",
    ),
    M(
        "parallelize/group_members.py",
        "        if instance.deferred:\n"
        "            y = instance.deferred_linear(h, module, self.index, self.f8())",
        "        if False:\n"
        "            y = instance.deferred_linear(h, module, self.index, self.f8())",
        "deferred ups reduce again (double)",
    ),
    M(
        "parallelize/group_norms.py",
        "        if instance.deferred:\n            stash = instance.new_stash()",
        "        if False:\n            stash = instance.new_stash()",
        "deferred group never reduces",
    ),
    M(
        "parallelize/group_norms.py",
        "instance.deferred = self.defer and instance.self_contained",
        "instance.deferred = self.defer",
        "defer a group with a parameter between down and up",
    ),
    M(
        "parallelize/groups.py",
        "self.parts = list(out.split(",
        "self.parts = list(out.roll(1, -1).split(",
        "group members' columns off by one",
    ),
    M(
        "parallelize/group_norms.py",
        "            out = comm.reduce_grad(normed, group, stash, weights)",
        "            out = normed",
        "replicated group's grad not all-reduced",
    ),
    M(
        "parallelize/group_norms.py",
        "            ys = list(\n"
        "                comm.column_linears(\n"
        "                    normed, weights, group, chunks=self.overlap_chunks, f8s=self.f8s\n"
        "                )\n"
        "            )",
        "            ys = [F.linear(normed, w) for w in weights]",
        "vanilla LaX ungrouped: input grad not reduced",
    ),
    M(
        "parallelize/group_norms.py",
        "            local(f.bias)\n            if f.bias is not None",
        "            0 * local(f.bias)\n            if f.bias is not None",
        "group biases dropped",
    ),
    # ---- the first-forward check and low-rank AC ---------------------------------------
    M(
        "parallelize/group_check.py",
        "        if output is not None and others:",
        "        if False:",
        "unlisted reader of a norm output not detected",
    ),
    M(
        "parallelize/group_check.py",
        "                if node in bypass:",
        "                if False:",
        "latent leaking past its up not detected",
    ),
    M(
        "parallelize/lowrank_ac.py",
        "    if _is_collective(func) or runs_ring(func, args):\n"
        "        return CheckpointPolicy.MUST_SAVE",
        "    if _is_collective(func) or runs_ring(func, args):\n"
        "        return CheckpointPolicy.PREFER_RECOMPUTE",
        "low-rank AC replays collectives",
    ),
    # ---- overlapped row blocks, low-rank AC placeholders, compiled AC ----------------------
    M(
        "parallelize/comm.py",
        "[_start_all_reduce(p, group) for p in partials_of(start, end)]",
        "[p.contiguous() for p in partials_of(start, end)]",
        "row blocks not all-reduced",
    ),
    M(
        "parallelize/comm.py",
        "bounds.append(bounds[-1] + size + (k < extra))",
        "bounds.append(bounds[-1] + size)",
        "uneven row blocks lose rows",
    ),
    M(
        "parallelize/comm.py",
        "grad_w = float8.weight_grad(grad, x, ctx.f8) if ctx.needs_input_grad[1] else None",
        "grad_w = 2 * float8.weight_grad(grad, x, ctx.f8) if ctx.needs_input_grad[1] else None",
        "overlapped row-parallel weight grad x2",
    ),
    M(
        "parallelize/lowrank_ac.py",
        "if not sink.read and sink.storages and sink.storages <= escaped",
        "if sink.storages and sink.storages <= escaped",
        "placeholder for a GEMM whose sum is read again",
    ),
    M(
        "parallelize/lowrank_ac.py",
        "if save_random and draws_random_numbers(func):",
        "if False:",
        "compiled AC recomputes attention under TP",
    ),
    M(
        "parallelize/groups.py",
        "return SHARED_ACTIVATIONS[type(self.activation)](out)",
        "return out",
        "group's shared SiLU dropped",
    ),
    M(
        "parallelize/group_members.py",
        "self.instance.record_activation(self.index, z)\n        return z",
        "self.instance.record_activation(self.index, z)\n        return z * z.sigmoid()",
        "shared SiLU applied again by each pair",
    ),
    M(
        "parallelize/groups.py",
        "if output is None or not group_check.same_data(z, output.narrow(-1, start, width)):",
        "if False:",
        "pair activation on another tensor than its down's output not detected",
    ),
    M(
        "parallelize/groups.py",
        "return first if same and own else None",
        "return first if same else None",
        "activation module held twice passed through",
    ),
]


def _copy_repo(dest: Path) -> None:
    """The files git tracks or would add (as in the working tree), with the package links."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, target)
    for package in ("parallelize", "kernels"):
        (dest / "boost_titan" / package).symlink_to(dest / package, target_is_directory=True)


def _killer(output: str) -> str | None:
    """The first failing test (or collection error) in pytest's output, None if all passed."""
    found = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - |$)", output, re.MULTILINE)
    if found:
        return found.group(1)
    return None if re.search(r"\d+ passed", output) and " failed" not in output else "pytest error"


def run(mutant: Mutant, copy: Path) -> tuple[str | None, float]:
    path = copy / mutant.path
    original = path.read_text()
    path.write_text(original.replace(mutant.old, mutant.new))
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    start = time.perf_counter()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", *TESTS, "-x", "-q", "-p", "no:cacheprovider", "-rfE"],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        path.write_text(original)
    return _killer(result.stdout + result.stderr), time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated mutant numbers (1-based)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    ns = parser.parse_args(argv)
    chosen = [int(i) for i in ns.only.split(",")] if ns.only else range(1, len(MUTANTS) + 1)
    for mutant in MUTANTS:
        count = (ROOT / mutant.path).read_text().count(mutant.old)
        if count != 1:
            raise SystemExit(f"mutant of {mutant.path} ({mutant.breaks}): text found {count} times")
    rows = ["| # | file | mutation | killed by |", "|---|---|---|---|"]
    survivors = 0
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        _copy_repo(copy)
        for i in chosen:
            mutant = MUTANTS[i - 1]
            if ns.list:
                killer, seconds = "-", 0.0
            else:
                killer, seconds = run(mutant, copy)
                survivors += killer is None
                outcome = f"{killer or 'SURVIVED'} ({seconds:.0f} s)"
                print(f"[{i}/{len(MUTANTS)}] {mutant.breaks}: {outcome}", flush=True)
            rows.append(
                f"| {i} | `{mutant.path}` | {mutant.breaks} | "
                f"{'**survived**' if killer is None else f'`{killer}`'} |"
            )
    print("\n".join(rows))
    if not ns.list:
        print(f"\n{len(chosen) - survivors} of {len(chosen)} mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
