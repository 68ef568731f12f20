"""One process per site directory (core layer): an exclusive lock on a directory's lock file.

A hub's data directory (catalog, leases, staging) and a spoke's cache directory (its
journal) are each owned by one process. Two owners corrupt them quietly (two journals
replaying the same writes, two hubs granting leases), so the second refuses to start,
naming the directory and the process that holds it. The lock is ``flock`` on
``<directory>/.loomfs.lock``: the kernel drops it when its holder dies, so a killed
process leaves nothing to clean up; the file keeps the holder's pid for the message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ..errors import ConfigError, from_oserror

LOCK_FILE = ".loomfs.lock"


class DirectoryLock:
    """Held from ``acquire`` to ``release`` (or the end of the process)."""

    def __init__(self, directory: Path, what: str) -> None:
        """``what`` names the directory in messages ("data directory", "cache directory")."""
        self.directory = directory
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise ``ConfigError`` naming the directory and the pid that
        holds it (a directory that cannot be written: the error ``from_oserror`` gives)."""
        path = self.directory / LOCK_FILE
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            err = from_oserror(exc, str(self.directory))
            err.message = f"cannot use the {self.what} {self.directory}: {exc.strerror or exc}"
            raise err from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            by = f"process {holder}" if holder else "another process"
            raise ConfigError(
                f"the {self.what} {self.directory} is in use by {by}; stop it, or give "
                "this one a directory of its own",
                path=str(self.directory),
            ) from None
        # the pid is for the message of a second process; the lock itself is the flock
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip())
    return None
