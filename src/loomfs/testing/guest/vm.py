"""A throwaway QEMU guest in a private network namespace (testing layer).

``Guest`` makes a network namespace with a tap device (the host's side of a /24 of its
own; the namespace itself, with its private ``/run`` and its processes, is a ``NetNamespace``),
and boots the cached image once per ``run``: the script runs as root in the guest, its
output and exit status come back, and a guest that never finishes is killed after a
timeout with its console log in the error. Servers the guest talks to run inside the
namespace: ``popen`` starts a process there, ``listen`` hands out a listening socket there
for a server in this process. Nothing leaves the namespace; it is deleted on exit, after
every process started in it has been stopped by its own pid.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..netns import NetNamespace, ip, random_subnet
from .image import BootImage, boot_image, cpio


class GuestError(RuntimeError):
    """The guest did not report an exit status (or reported a failing one)."""


@dataclass(frozen=True)
class GuestResult:
    """What one boot returned: the script's exit status and output, the console log."""

    rc: int
    output: str
    console: str
    seconds: float


def _tail(text: str, limit: int = 6000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


class Guest(NetNamespace):
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
        super().__init__()
        if not Path("/dev/net/tun").exists():
            raise RuntimeError("the guest needs /dev/net/tun: modprobe tun (in a container: "
                               "--device /dev/net/tun --cap-add NET_ADMIN)")  # fmt: skip
        self.image: BootImage = boot_image(cache)
        self.memory_mb = memory_mb
        self.timeout = timeout
        self.accel = accel
        subnet = random_subnet()
        self.host_ip = f"{subnet}.1"
        self.guest_ip = f"{subnet}.2"

    def setup(self) -> None:
        ip("-n", self.netns, "tuntap", "add", "dev", "tap0", "mode", "tap")
        ip("-n", self.netns, "addr", "add", f"{self.host_ip}/24", "dev", "tap0")
        ip("-n", self.netns, "link", "set", "tap0", "up")

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
            # no_timer_check: under software emulation on a busy host the kernel's check
            # of the IO-APIC timer can miss its ticks and panic the boot ("IO-APIC + timer
            # doesn't work"); the emulated timer is fine, only slow
            "-append", "console=ttyS0 quiet panic=-1 no_timer_check",
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
