"""Stopping a loomfs process at a named stage of a change, for kill -9 and SIGINT tests of
every protocol's write path (testing layer).

The hooks sit in the hub's volume and namespace and in the spoke's upload, below every
protocol edge, so one set of stages serves REST, S3, SFTP, FUSE and the fabric link
alike. A process started with ``pausing``'s environment imports them at its start
(``sitecustomize``): the change stops at the stage ``LOOMFS_TEST_STAGE`` names, says so in
the file ``LOOMFS_TEST_AT`` names, and goes on once the test has signalled it (``stop``
says so in a ``.go`` file beside it), or after 3 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

from .hubproc import LoomfsProcess

#: where each stage stops, as the hooks below place it
STAGES = {
    "staged": "a write's bytes all spooled into its temp file, nothing renamed yet",
    "renamed": "a write's file at its name on the volume; the catalog not told",
    "recorded": "a write in the catalog; its answer not yet sent",
    "torn": "a hard-linked file's in-place commit: the file emptied, the new bytes not in",
    "moved": "a move done on the volume; the catalog not told",
    "removed": "one file of a directory's removal gone; the catalog not told",
    "made": "a new directory on the volume; the catalog not told",
    "linked": "a new symlink on the volume; the catalog not told",
    "chmodded": "a chmod done on the volume; the catalog not told",
    "journaled": "a write-back spoke's write acknowledged and journaled, not yet sent",
    "uploaded": "a write-back spoke's write committed at the hub, still in the journal",
}

_HOOKS = textwrap.dedent("""
    import asyncio, os, time
    from pathlib import Path

    STAGE, AT = os.environ.get("LOOMFS_TEST_STAGE"), os.environ.get("LOOMFS_TEST_AT")
    if STAGE and AT:
        from loomfs.core.backends.posix import PosixBackend
        from loomfs.hub.namespace import HubNamespace
        from loomfs.spoke.namespace import SpokeNamespace

        GO = Path(AT + ".go")

        def reached():  # in a worker thread: the event loop goes on meanwhile
            Path(AT).write_text(STAGE)
            for _ in range(150):
                if GO.exists():
                    break
                time.sleep(0.02)

        async def areached():
            Path(AT).write_text(STAGE)
            for _ in range(150):
                if GO.exists():
                    break
                await asyncio.sleep(0.02)

        def sync_hook(cls, name, before=None, after=None):
            real = getattr(cls, name)

            def hooked(*args, **kwargs):
                if STAGE == before:
                    reached()
                done = real(*args, **kwargs)
                if STAGE == after:
                    reached()
                return done

            setattr(cls, name, hooked)

        def async_hook(cls, name, before=None, after=None):
            real = getattr(cls, name)

            async def hooked(*args, **kwargs):
                if STAGE == before:
                    await areached()
                done = await real(*args, **kwargs)
                if STAGE == after:
                    await areached()
                return done

            setattr(cls, name, hooked)

        sync_hook(PosixBackend, "_commit", before="staged", after="renamed")
        import loomfs.core.backends.posix as posix

        real_copy = posix.copy_sparse

        def copy_sparse(source, target, size):  # into a hard-linked file emptied for it
            st = os.fstat(target)
            if STAGE == "torn" and st.st_nlink > 1 and st.st_size == 0:
                reached()
            return real_copy(source, target, size)

        posix.copy_sparse = copy_sparse
        async_hook(HubNamespace, "_apply_record", after="recorded")
        async_hook(PosixBackend, "rename", after="moved")
        async_hook(PosixBackend, "delete", after="removed")
        async_hook(PosixBackend, "mkdir", after="made")
        async_hook(PosixBackend, "symlink", after="linked")
        async_hook(PosixBackend, "set_attrs", after="chmodded")
        async_hook(SpokeNamespace, "_upload", before="journaled")
        async_hook(SpokeNamespace, "_send", after="uploaded")
""")


def pausing(tmp: Path, stage: str) -> tuple[dict[str, str], Path]:
    """The environment of a process that pauses at ``stage``, and the file saying it has."""
    assert stage in STAGES, f"no such stage {stage!r}: {sorted(STAGES)}"
    hooks = tmp / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(_HOOKS)
    at = tmp / "reached"
    path = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "LOOMFS_TEST_STAGE": stage, "LOOMFS_TEST_AT": str(at)}, at


#: seconds a process may take to reach its stage (one starting beside a loaded suite)
REACH_WITHIN = 120.0


async def reached(at: Path, stage: str, task: asyncio.Future[Any] | None = None) -> None:
    """Wait until the process says it is at ``stage`` (or ``task``, the change, ended
    without getting there: a failure naming the stage)."""
    # generous: a process starting on a loaded machine is slow, never wrong, to get there
    deadline = time.monotonic() + REACH_WITHIN
    while time.monotonic() < deadline:
        if at.exists() or (task is not None and task.done()):
            break
        await asyncio.sleep(0.02)
    assert at.exists() and at.read_text() == stage, f"{stage} was never reached"


#: how long a SIGINT has to reach the process's event loop before its paused stage goes on
SIGNAL_LEAD = 0.5


def interrupt(process: LoomfsProcess, how: signal.Signals) -> None:
    """kill -9, or SIGINT: then the paused stage goes on once the signal has had time to
    arrive, so the process stops with the change in flight (not after a fixed pause)."""
    if how == signal.SIGKILL:
        process.kill()
        return
    os.killpg(process.pid, signal.SIGINT)
    at = process.env.get("LOOMFS_TEST_AT")
    if at:
        time.sleep(SIGNAL_LEAD)
        Path(at + ".go").touch()


def stop(process: LoomfsProcess, how: signal.Signals) -> None:
    """``interrupt`` it, and wait until it has stopped (SIGKILL if it lingers)."""
    interrupt(process, how)
    process.stop()


def resumed(process: LoomfsProcess, at: Path) -> None:
    """``process`` starts again (after ``stop``) without pausing anywhere."""
    at.unlink(missing_ok=True)
    Path(f"{at}.go").unlink(missing_ok=True)
    process.env.pop("LOOMFS_TEST_STAGE", None)
    process.start()
