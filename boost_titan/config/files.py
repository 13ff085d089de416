"""Files that come from outside (a TOML, a prepared folder, a tokenizer), read safely.

`read_capped` reads a regular file of at most `limit` bytes: a FIFO, a device or a symlink
to one is refused before it is opened (it would block or never end), and a file over the
cap before it is read. `inside` turns a name a manifest gives into a path in its folder:
one plain file name (no `/`, no `..`, not absolute), which must not be a symlink. Every
refusal is a one-line ConfigError naming `what` the file is. Torch-free.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from boost_titan.config.errors import ConfigError

# Caps on what a foreign file may hold, in bytes:
TOML_MAX_BYTES = 16 << 20
"""A job's TOML."""
MANIFEST_MAX_BYTES = 64 << 20
"""A prepared folder's manifest.json (one shard's entry is about 100 bytes)."""
TOKENIZER_MAX_BYTES = 64 << 20
"""A Hugging Face tokenizer file (Llama 3's tokenizer.json is 9 MB, the largest public
ones about 35 MB)."""
MEGATRON_INDEX_MAX_BYTES = 32 << 30
"""A Megatron-LM `.idx` (12 bytes a sequence, 8 a document: 32 GiB is about 1.6 billion
documents of one sequence each); memory-mapped and read in blocks, never loaded whole."""
TIKTOKEN_MAX_BYTES = 16 << 20
"""A tiktoken BPE file (Llama 3's is 2.2 MB, o200k's 3.6 MB); its ranks live in a dict."""

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
"""A file name a manifest may give: letters, digits, `.`, `_`, `-`, no leading dot."""


def regular_size(path: Path, what: str, limit: int) -> int:
    """The size of `path` (symlinks followed); ConfigError unless it is a regular file of at
    most `limit` bytes."""
    try:
        info = os.stat(path)
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or type(e).__name__
        raise ConfigError(f"{what} {path} cannot be read ({reason})") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(
            f"{what} {path} is not a regular file (a FIFO, device or folder); give a file"
        )
    if info.st_size > limit:
        raise ConfigError(
            f"{what} {path} is {info.st_size:,} bytes, over the {limit:,} a {what} may have"
        )
    return info.st_size


def read_capped(path: Path, what: str, limit: int) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes (`regular_size`); opened
    non-blocking, so a file swapped for a FIFO after the check cannot hang the reader."""
    regular_size(path, what, limit)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{what} {path} is not a regular file; give a file")
            data = f.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read ({e.strerror})") from None
    if len(data) > limit:
        raise ConfigError(f"{what} {path} grew past the {limit:,} bytes a {what} may have")
    return data


def inside(folder: Path, name: object, suffix: str, what: str) -> Path:
    """`folder / (name + suffix)` for a plain file `name` a manifest gives; ConfigError for
    anything else (a path, `..`, an absolute name, not a string) or a symlink there."""
    if not (isinstance(name, str) and _PLAIN_NAME.fullmatch(name)):
        raise ConfigError(
            f"{what} names the file {str(name)[:80]!r}, not a plain file name in its folder "
            "(no '/', '..' or leading '.'); prepare the folder again"
        )
    path = folder / f"{name}{suffix}"
    if path.is_symlink():
        raise ConfigError(
            f"{what}: {path.name} is a symlink; a prepared folder holds its own files "
            "(copy the file in, or prepare the folder again)"
        )
    return path
