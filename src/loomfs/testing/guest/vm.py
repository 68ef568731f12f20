"""A throwaway QEMU guest in a private network namespace (testing layer).

``Guest`` makes a network namespace with a tap device (the host's side of a /24 of its
own), keeps a private ``/run`` for the servers started in it (rpcbind's socket, pid files),
and boots the cached image once per ``run``: the script runs as root in the guest, its
output and exit status come back, and a guest that never finishes is killed after a
timeout with its console log in the error. Servers the guest talks to run inside the
namespace: ``popen`` starts a process there, ``listen`` hands out a listening socket there
for a server in this process. Nothing leaves the namespace; it is deleted on exit, after
every process started in it has been stopped by its own pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from ..ports import stop_process
from .image import BootImage, boot_image, cpio, require

_CLONE_NEWNET = 0x40000000
T = TypeVar("T")


class GuestError(RuntimeError):
    """The guest did not report an exit status (or reported a failing one)."""


@dataclass(frozen=True)
class GuestResult:
    """What one boot returned: the script's exit status and output, the console log."""

    rc: int
    output: str
    console: str
    seconds: float


def _ip(*args: str) -> None:
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


def _sweep() -> None:
    """Take down what guests of processes that died without cleaning up (SIGKILL, or a
    SIGTERM, which skips ``__exit__``) left behind: their namespaces, what still runs in
    them (by pid) and their files. A namespace is a guest's by its name, which carries
    its creator's pid; a live creator's is left alone."""
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


def _tail(text: str, limit: int = 6000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


class Guest:
    """The namespace, its servers and the guest booted in it; a context manager.

    ``host_ip`` is the host's address in the namespace (servers bind there), ``guest_ip``
    the guest's, in a random 10.x.y.0/24: each namespace is private, so two guests that
    drew the same subnet still do not clash, and the draw keeps their logs apart.
    """

    def __init__(
        self,
        *,
        memory_mb: int = 512,
        timeout: float = 300.0,
        cache: Path | None = None,
        accel: str = "tcg",
    ) -> None:
        # the nested KVM of the project's machines cannot run a stock kernel: TCG by default
        require("ip", "nsenter", hint="apt-get install -y iproute2 util-linux")
        if os.geteuid() != 0:
            raise RuntimeError("the guest needs root (a network namespace, a tap device)")
        if not Path("/dev/net/tun").exists():
            raise RuntimeError("the guest needs /dev/net/tun: modprobe tun (in a container: "
                               "--device /dev/net/tun --cap-add NET_ADMIN)")  # fmt: skip
        self.image: BootImage = boot_image(cache)
        self.memory_mb = memory_mb
        self.timeout = timeout
        self.accel = accel
        self.netns = f"loomfs-{os.getpid()}-{secrets.token_hex(3)}"
        subnet = f"10.{random.randint(64, 250)}.{random.randint(1, 254)}"
        self.host_ip = f"{subnet}.1"
        self.guest_ip = f"{subnet}.2"
        #: the jobs' and servers' files, named like the namespace (a sweep finds both)
        self.workdir = Path(tempfile.gettempdir()) / self.netns
        self._holder: subprocess.Popen[bytes] | None = None
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Self:
        _sweep()
        _ip("netns", "add", self.netns)
        try:
            self.workdir.mkdir(mode=0o700)
            _ip("-n", self.netns, "link", "set", "lo", "up")
            _ip("-n", self.netns, "tuntap", "add", "dev", "tap0", "mode", "tap")
            _ip("-n", self.netns, "addr", "add", f"{self.host_ip}/24", "dev", "tap0")
            _ip("-n", self.netns, "link", "set", "tap0", "up")
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
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------ servers in the namespace

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` made to run in the namespace (network and private /run); nsenter
        execs it, so the process keeps the pid it was started with."""
        assert self._holder is not None, "use the guest as a context manager"
        return ["nsenter", "-t", str(self._holder.pid), "-m", "-n", "--", *argv]

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
        assert self._holder is not None, "use the guest as a context manager"
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
                    raise OSError(ctypes.get_errno(), "setns into the guest's namespace")
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

    # ------------------------------------------------------------ the guest itself

    def run(
        self,
        script: str,
        *,
        share: Path | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> GuestResult:
        """Boot the guest, run ``script`` (busybox sh, as root, in /tmp) and power off.

        ``share`` is this machine's directory seen at ``/host`` in the guest (9p); the
        script also finds ``$HOST_IP``, ``$GUEST_IP`` and ``env`` in its environment.
        With ``check``, a non-zero exit status raises ``GuestError`` with the output.
        It blocks: to act on the host while the guest runs, call it on another thread
        and keep in step through files in the share (9p sees them at once).
        """
        job = self.workdir / f"job-{secrets.token_hex(4)}"
        job.mkdir()
        variables = {"HOST_IP": self.host_ip, "GUEST_IP": self.guest_ip, **(env or {})}
        if share is not None:
            variables["SHARE"] = "/host"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in variables.items())
        archive = cpio([
            ("job/env", 0o100644, exports.encode()),
            ("job/test.sh", 0o100755, script.encode()),
        ])  # fmt: skip
        initrd = job / "initrd.img"
        initrd.write_bytes(self.image.initramfs.read_bytes() + archive)
        console, output = job / "console.log", job / "output.log"
        argv = [
            "qemu-system-x86_64", "-accel", self.accel, "-m", str(self.memory_mb), "-smp", "1",
            "-nodefaults", "-display", "none", "-no-reboot",
            "-serial", f"file:{console}", "-serial", f"file:{output}",
            "-kernel", str(self.image.vmlinux), "-initrd", str(initrd),
            "-append", "console=ttyS0 quiet panic=-1",
            "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
            "-device", "virtio-net-pci,netdev=n0,romfile=",
        ]  # fmt: skip
        if share is not None:
            argv += ["-virtfs", f"local,path={share},mount_tag=host,security_model=none,id=host"]
        started = time.monotonic()
        try:
            qemu = subprocess.run(
                self.command(argv),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout or self.timeout,
                check=False,
            )
            qemu_said = qemu.stderr
        except subprocess.TimeoutExpired:
            qemu_said = f"(killed after {timeout or self.timeout} s)"
        seconds = time.monotonic() - started
        log = _read(console)
        result = GuestResult(_exit_status(log), _read(output), log, seconds)
        initrd.unlink()
        if result.rc < 0 or (check and result.rc != 0):
            what = f"exited with {result.rc}" if result.rc >= 0 else "reported no exit status"
            raise GuestError(
                f"guest script {what} after {seconds:.0f} s; qemu: {qemu_said.strip()}\n"
                f"--- output:\n{_tail(result.output)}\n--- console:\n{_tail(log)}"
            )
        return result


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n")
    except FileNotFoundError:
        return ""


def _exit_status(console: str) -> int:
    marker = "LOOMFS-GUEST-RC="
    for line in reversed(console.splitlines()):
        if line.startswith(marker):
            return int(line[len(marker) :].split()[0])
    return -1
