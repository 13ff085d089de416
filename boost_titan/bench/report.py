"""The one `--json PATH|-` writer of the `bench` subcommands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
