"""The `--json PATH|-` option of the `bench` subcommands and its one writer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RECORDS_HELP = "write the records as a JSON list ('-': stdout only)"


def add_json_option(parser: Any, help: str = RECORDS_HELP, metavar: str = "PATH|-") -> None:
    """The subcommand's `--json` option, which `write_json` serves."""
    parser.add_argument("--json", metavar=metavar, help=help)


def write_json(payload: Any, target: str | None) -> None:
    """`payload` as indented JSON: on stdout for '-', into the file `target` names, or
    nowhere when `target` is empty. Callers print their text only when `target` is not
    '-', so `--json -` prints the JSON alone."""
    if not target:
        return
    text = json.dumps(payload, indent=1)
    if target == "-":
        print(text)
    else:
        Path(target).write_text(text)
