"""A plan as a table: for each plan key, the style, weight placements, activation layouts
in and out, and the collectives one call issues forward and backward (elements per token
of each rank's buffer). Computed from the styles on the unsharded model: nothing is
applied."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from .plans import Plan, Resolved, resolve_plan
from .styles import Collective, Role, TPStyle

_NAMES = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
}


@dataclass(frozen=True)
class PlanRow:
    key: str
    matches: int
    role: Role


def plan_rows(model: nn.Module, plan: Plan, tp: int) -> list[PlanRow]:
    """One row per plan key that matches a module, described on its first match, in the
    order the model holds the modules."""
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    by_key: dict[str, list[Resolved]] = {}
    for r in resolve_plan(model, plan, tp):
        by_key.setdefault(r.key, []).append(r)
    rows = sorted(by_key.items(), key=lambda item: order[item[1][0].fqn])
    return [PlanRow(key, len(found), _role(found[0], tp)) for key, found in rows]


def _role(r: Resolved, tp: int) -> Role:
    if isinstance(r.style, TPStyle):
        return r.style.role(r.module, tp)
    return Role(type(r.style).__name__, "?", "?", "?")


def collectives_under(
    model: nn.Module, plan: Plan, tp: int, prefix: str
) -> tuple[list[Collective], list[Collective]]:
    """All collectives (forward, backward) of the modules whose FQN starts with `prefix`
    (e.g. one block, "layers.0.")."""
    forward: list[Collective] = []
    backward: list[Collective] = []
    for r in resolve_plan(model, plan, tp):
        if r.fqn.startswith(prefix):
            role = _role(r, tp)
            forward += role.forward
            backward += role.backward
    return forward, backward


def format_collectives(calls: Sequence[Collective]) -> str:
    return ", ".join(f"{_NAMES.get(kind, kind)} {n}" for kind, n in calls) or "-"


def _backward_cell(role: Role) -> str:
    """The per-token backward collectives, then those of weight grads (per call)."""
    weight_grads = [f"{format_collectives([c])} (weight grad)" for c in role.weight_grads]
    calls = [format_collectives(role.backward)] if role.backward else []
    return ", ".join(calls + weight_grads) or "-"


def plan_table(model: nn.Module, plan: Plan, tp: int, *, markdown: bool = False) -> str:
    """The plan as a text (or markdown) table, one line per plan key.

    For each key (with its number of matches): the style, the weight placements, the
    activation layouts in and out, and the collectives one call issues forward and
    backward (elements per token of each rank's buffer). Computed on the unsharded model
    for a TP degree: nothing is applied, no process group is needed.

    Args:
        model (nn.Module): the unsharded model.
        plan (Plan): FQN pattern -> style, e.g. from `btp_plan`.
        tp (int): the TP degree to describe.
        markdown (bool): a markdown table instead of aligned text. Default: False.

    Returns:
        str: the table.

    Raises:
        PlanError: the plan does not fit the model (see `resolve_plan`).

    Example::

        >>> from torch import nn
        >>> from boost_titan.parallelize import ColumnParallel, RowParallel, plan_table
        >>> mlp = nn.Sequential(
        ...     nn.Linear(16, 64, bias=False), nn.ReLU(), nn.Linear(64, 16, bias=False)
        ... )
        >>> print(plan_table(mlp, {"0": ColumnParallel(), "2": RowParallel()}, tp=2))
        module  style           weights      in          out         forward        backward
        ------  --------------  -----------  ----------  ----------  -------------  -------------
        0       ColumnParallel  weight S(0)  replicated  sharded     -              all-reduce 16
        2       RowParallel     weight S(1)  sharded     replicated  all-reduce 16  -
    """
    header = ("module", "style", "weights", "in", "out", "forward", "backward")
    lines = [header]
    for row in plan_rows(model, plan, tp):
        role = row.role
        key = f"`{row.key}`" if markdown else row.key
        key += f" (x{row.matches})" if row.matches > 1 else ""
        lines.append(
            (
                key,
                role.style,
                role.weights,
                role.inputs,
                role.output,
                format_collectives(role.forward),
                _backward_cell(role),
            )
        )
    if markdown:
        rendered = ["| " + " | ".join(line) + " |" for line in lines]
        rendered.insert(1, "|" + "---|" * len(header))
        return "\n".join(rendered)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    rendered.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(rendered)
