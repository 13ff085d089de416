"""Compare two folders of scripts/record_outputs.sh: python scripts/compare_outputs.py BEFORE AFTER.

Masks what changes from run to run (bench trace's wall-clock seconds, the memory check's
seconds column) and prints a unified diff per file that still differs."""

import difflib
import re
import sys
from pathlib import Path


def mask(name: str, text: str) -> str:
    if name.startswith("trace"):
        text = re.sub(r'"trace_s": [0-9.e-]+', '"trace_s": T', text)
        text = re.sub(r"(\s)\d+\.\d\d(\s+(agrees|-|MISMATCH\S*)\s*$)", r"\1T\2", text, flags=re.M)
    if name.startswith("memory_check"):
        text = re.sub(r"\| \d+ \|$", "| S |", text, flags=re.M)
    return text


before, after = Path(sys.argv[1]), Path(sys.argv[2])
names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
same = 0
for name in names:
    a, b = before / name, after / name
    if not a.exists() or not b.exists():
        print(f"only in {'after' if b.exists() else 'before'}: {name}")
        continue
    x, y = mask(name, a.read_text()), mask(name, b.read_text())
    if x == y:
        same += 1
        continue
    print(f"== {name}")
    sys.stdout.writelines(difflib.unified_diff(x.splitlines(True), y.splitlines(True), n=1))
print(f"{same} of {len(names)} identical")
