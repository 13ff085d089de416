"""`python -m boost_titan.bench SUBCOMMAND ...`: the benchmark command line.

Each subcommand is a module of `bench.commands` (its help line `HELP`, its options
`add_args`, its `run`); SUBCOMMANDS lists them in the order `--help` shows them. Only the
chosen subcommand's options are built, and the harnesses of `bench.measure` (torch) are
imported inside the subcommands that run them, so `--help` and the analytic `model` start
at once. A subcommand whose options set `trainer_args` receives the arguments it does not
know there (`bench step`, `bench data`); the others refuse them.
"""

from __future__ import annotations

import sys
from types import ModuleType

from boost_titan.bench.commands import (
    compile,
    cpu,
    data,
    memory,
    model,
    plot,
    precision,
    quality,
    step,
    trace,
    validate,
)
from boost_titan.config.cli import OneLineParser
from boost_titan.config.errors import ConfigError

SUBCOMMANDS: dict[str, ModuleType] = {
    "model": model,
    "precision": precision,
    "validate": validate,
    "plot": plot,
    "trace": trace,
    "memory": memory,
    "cpu": cpu,
    "compile": compile,
    "step": step,
    "data": data,
    "quality": quality,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineParser(prog="python -m boost_titan.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, command in SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=command.HELP)
        if name == chosen:
            command.add_args(subparser)
    ns, extra = parser.parse_known_args(argv)
    takes_extra = hasattr(ns, "trainer_args")
    if extra and not takes_extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if takes_extra:
        ns.trainer_args = extra
    try:
        return SUBCOMMANDS[ns.command].run(ns)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
