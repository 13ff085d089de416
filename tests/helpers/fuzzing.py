"""What the two seeded fuzzers share (`checkpoint_fuzz`: a checkpoint; `input_fuzz`: a
prepared folder, tokenizer files and a TOML): the alarm that ends a case, the watch on the
files a case opens, and the outcome of one read."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class CaseTimeout(Exception):
    """A case ran past its alarm."""


def raise_timeout(signum: int, frame: Any) -> None:
    """The SIGALRM handler every fuzzer's child installs."""
    raise CaseTimeout("ran past its alarm")


class OpenWatch:
    """Records every file a case opens outside its folder: next to it (under `root`, the
    cases' parent, with a file outside each; not Python's own files), or under one of
    `forbidden`. Set `folder` before a case, None after."""

    def __init__(self, root: Path, forbidden: tuple[str, ...] = ("/dev/", "/proc/")) -> None:
        self.root = os.path.realpath(root)
        self.forbidden = forbidden
        self.folder: str | None = None
        self.outside: list[str] = []
        sys.addaudithook(self.hook)

    def hook(self, event: str, args: tuple) -> None:
        if event != "open" or self.folder is None or not isinstance(args[0], (str, Path)):
            return
        path = os.path.realpath(args[0])
        within = os.path.commonpath([self.folder, path]) == self.folder
        nearby = os.path.commonpath([self.root, path]) == self.root
        if (nearby and not within) or path.startswith(self.forbidden):
            self.outside.append(path)


def read_outcome(
    read: Callable[[], Any], seconds: float, hidden: tuple[str, ...], watch: OpenWatch
) -> tuple[str, str, Any]:
    """`read()` under an alarm of `seconds`: ("ok", "", its value); ("refused", the line,
    None) for a one-line ConfigError naming none of `hidden` (failures a refusal must not
    hide); else ("FAIL", why, None). Ends the watch's case."""
    from boost_titan.config.errors import ConfigError

    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return "ok", "", read()
    except ConfigError as e:
        detail = str(e)
        bad = "\n" in detail or any(word in detail for word in hidden)
        return ("FAIL" if bad else "refused"), detail, None
    except BaseException as e:  # every other ending is the failure
        return "FAIL", f"{type(e).__name__}: {str(e)[:300]}", None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        watch.folder = None
