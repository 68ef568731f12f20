"""Free loopback ports and process handling for test servers (testing layer).

Servers started by tests, the demo and benchmarks bind to ports the kernel hands out and
are stopped by their own process id, never by name; an aiohttp app in the test's own
process is served on a free port by ``serving``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator

from aiohttp import web


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(
    port: int, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Block until something accepts on 127.0.0.1:port, or fail with what went wrong."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"process {proc.args!r} exited with {proc.returncode} before listening"
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stop_process(
    proc: subprocess.Popen[bytes], timeout: float = 10.0, how: int = signal.SIGTERM
) -> None:
    """Stop a process we started (and its process group) by pid: ``how`` (TERM), then KILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, how)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port for the block; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()
