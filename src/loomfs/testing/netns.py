"""Throwaway network namespaces for tests and benchmarks (testing layer).

``NetNamespace`` makes a namespace with its loopback up and a private ``/run`` (rpcbind's
socket, pid files), starts processes in it (``popen``, or ``command`` as a prefix), hands
out sockets created there (``in_netns``, ``listen``) and deletes it on exit, after every
process started in it has been stopped by its own pid. What it connects to is its user's:
a QEMU guest's tap device (``guest.vm``), a shaped veth pair to this namespace (``kwan``).
A namespace is named after its creator's pid, so one left by a process that died without
cleaning up (SIGKILL) is swept by the next one made.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from .ports import stop_process

_CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def ip(*args: str) -> None:
    """``ip ARGS``, failing with what it said."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _ip_output(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False).stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True


def sweep() -> None:
    """Take down what namespaces of processes that died without cleaning up (SIGKILL, or a
    SIGTERM, which skips ``__exit__``) left behind: the namespaces, what still runs in
    them (by pid) and their files. A namespace is ours by its name, which carries its
    creator's pid; a live creator's is left alone."""
    for line in _ip_output("netns", "list").splitlines():
        name = line.split(" ", 1)[0]
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != "loomfs" or not parts[1].isdigit():
            continue
        if _alive(int(parts[1])):
            continue
        for pid in _ip_output("netns", "pids", name).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        _ip_output("netns", "del", name)
        shutil.rmtree(Path(tempfile.gettempdir()) / name, ignore_errors=True)


def random_subnet() -> str:
    """A random 10.x.y (a /24's first three octets): namespaces are private, so two that
    drew the same one do not clash; the draw keeps their logs apart."""
    return f"10.{random.randint(64, 250)}.{random.randint(1, 254)}"


def require_root(what: str) -> None:
    """Fail, saying how to get them, without the tools and rights a namespace needs."""
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{what} needs {tool}: apt-get install -y iproute2 util-linux")
    if os.geteuid() != 0:
        raise RuntimeError(f"{what} needs root")


class NetNamespace:
    """A private network namespace and the processes started in it; a context manager.

    ``host_ip`` is the address servers in the namespace bind to, once its user has put it
    on a device there (the namespace itself only has its loopback).
    """

    host_ip = "127.0.0.1"

    def __init__(self) -> None:
        require_root("a network namespace")
        self.netns = f"loomfs-{os.getpid()}-{secrets.token_hex(3)}"
        #: the jobs' and servers' files, named like the namespace (a sweep finds both)
        self.workdir = Path(tempfile.gettempdir()) / self.netns
        self._holder: subprocess.Popen[bytes] | None = None
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Self:
        sweep()
        ip("netns", "add", self.netns)
        try:
            self.workdir.mkdir(mode=0o700)
            ip("-n", self.netns, "link", "set", "lo", "up")
            self.setup()
            # every `ip netns exec` gets a mount namespace of its own; one process holding
            # one (with a tmpfs on /run) lets rpcbind and the servers that register with
            # it share /run/rpcbind.sock without touching the host's /run
            self._holder = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, "sh", "-c",
                 "mount -t tmpfs run /run && echo ready && exec sleep infinity"],
                stdout=subprocess.PIPE,
                start_new_session=True,
            )  # fmt: skip
            assert self._holder.stdout is not None
            if self._holder.stdout.readline() != b"ready\n":
                raise RuntimeError("could not give the namespace a private /run")
        except BaseException:
            self._teardown()
            raise
        return self

    def setup(self) -> None:
        """The devices a subclass puts in the namespace (and this one's ends of them)."""

    def teardown(self) -> None:
        """Undo what ``setup`` did outside the namespace (inside, the namespace goes)."""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._teardown()

    def _teardown(self) -> None:
        for proc in reversed(self._procs):
            stop_process(proc)
        if self._holder is not None:
            stop_process(self._holder)
            if self._holder.stdout is not None:
                self._holder.stdout.close()
        self.teardown()
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` made to run in the namespace (network and private /run), in this
        process's working directory (a relative ``PYTHONPATH`` still holds); nsenter
        execs it, so the process keeps the pid it was started with."""
        assert self._holder is not None, "use the namespace as a context manager"
        where = f"--wd={os.getcwd()}"
        return ["nsenter", "-t", str(self._holder.pid), "-m", "-n", where, "--", *argv]

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` in the namespace, in a session of its own (a server that
        signals its process group, as smbd does, reaches only itself); ``stop`` or the
        end of the ``with`` block stops it by its pid."""
        proc: subprocess.Popen[bytes] = subprocess.Popen(
            self.command(argv), start_new_session=True, **kwargs
        )
        self._procs.append(proc)
        return proc

    @property
    def processes(self) -> tuple[subprocess.Popen[bytes], ...]:
        """What ``popen`` started and nothing has stopped yet."""
        return tuple(self._procs)

    def stop(self, proc: subprocess.Popen[bytes], how: int = signal.SIGTERM) -> None:
        stop_process(proc, how=how)
        if proc in self._procs:
            self._procs.remove(proc)

    def path(self, path: str) -> Path:
        """Where the namespace's ``path`` (in its private /run) is seen from the host."""
        assert self._holder is not None, "use the namespace as a context manager"
        return Path(f"/proc/{self._holder.pid}/root") / path.lstrip("/")

    def in_netns(self, make: Callable[[], T]) -> T:
        """``make()`` called on a thread that joined the namespace: sockets it creates
        live there for good (a listener, a client of the namespace's rpcbind), while this
        process stays where it was."""
        result: list[T] = []
        failure: list[BaseException] = []

        def joined() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the namespace")
                result.append(make())
            except BaseException as error:  # handed to the caller's thread
                failure.append(error)
            finally:
                os.close(fd)

        thread = threading.Thread(target=joined, name=f"netns-{self.netns}")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]
        return result[0]

    def listen(self, port: int = 0) -> socket.socket:
        """A TCP socket listening on ``host_ip:port`` in the namespace, for a server in
        this process (asyncio's ``start_server(sock=...)``); it can still reach this
        machine's loopback, which a server started with ``popen`` cannot."""

        def make() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host_ip, port))
            sock.listen(64)
            return sock

        return self.in_netns(make)

    def wait_for_port(
        self,
        port: int,
        proc: subprocess.Popen[bytes] | None = None,
        host: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        """Block until something accepts on ``host:port`` (default ``host_ip``) in the
        namespace; fail early if ``proc`` exits first."""
        address = (host or self.host_ip, port)

        def accepts() -> bool:
            with socket.socket() as sock:
                sock.settimeout(0.5)
                return sock.connect_ex(address) == 0

        deadline = time.monotonic() + timeout
        while not self.in_netns(accepts):
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before listening")
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {address} in {self.netns}")
            time.sleep(0.1)
