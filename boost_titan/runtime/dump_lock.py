"""One job per dump folder: an exclusive `flock` on `<dump_folder>/.boost_titan.lock`.

Global rank 0 takes the lock before anything is written and holds it until its process
ends; the kernel releases it however the process ends (a SIGKILLed job never blocks the
next one; Linux NFS clients map `flock` onto POSIX locks, which the server arbitrates).
The holder writes its pid, host and start time into the file, so a second job's one-line
error names it. `boost_titan.check` probes the lock before any worker starts.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time

from boost_titan.config.errors import ConfigError

LOCK_FILE = ".boost_titan.lock"


class DumpFolderLock:
    """The lock of one dump folder, held from `acquire()` until `release()` or exit."""

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and record this process in it, or raise ConfigError naming the
        job that holds it."""
        fd = self._locked_fd()
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock back (closing the file releases it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def probe(self) -> None:
        """Raise like `acquire` if another job holds the lock; create, hold and write nothing."""
        if os.path.exists(self.path):  # without the file no job holds the lock
            os.close(self._locked_fd(create=False))

    def _locked_fd(self, create: bool = True) -> int:
        """The lock file, opened (created if needed and `create`) and locked by us."""
        try:
            if create:
                os.makedirs(self.folder, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except OSError as e:
            raise ConfigError(
                f"cannot open the lock file {self.path} ({e.strerror or type(e).__name__}); "
                "set --job.dump_folder to a writable path"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(
                    f"cannot lock {self.path} ({e.strerror}); the file system of job.dump_folder "
                    "does not support locks, choose a folder on one that does"
                ) from None
            raise ConfigError(
                f"job.dump_folder {self.folder} is in use by another job ({holder}); wait for it "
                "to finish, or set --job.dump_folder to another folder"
            ) from None
        return fd


def _read_holder(fd: int) -> str:
    """`pid 123 on host h, since ...` from the lock file, or what is known of it."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder not recorded yet"
