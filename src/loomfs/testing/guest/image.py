"""The guest's boot image: a stock Debian kernel and a busybox initramfs (testing layer).

The kernel comes from Debian's ``linux-image-amd64`` package, downloaded with ``apt-get
download`` and unpacked with ``dpkg-deb -x``, never installed. The initramfs holds a static
busybox, the modules for virtio, NFS, SMB and 9p (with their dependencies, as ``modprobe``
resolves them) and an ``init`` that brings the network up, runs the job's script and
powers off. Both are built once per machine into a cache directory keyed by the kernel
package's version, so only the first guest on a machine pays the ~30-40 s of setup (an
initramfs is rebuilt, from the kept package, when what goes into it changes).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import lzma
import os
import shutil
import stat
import struct
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "apt-get install -y qemu-system-x86 busybox-static kmod"
KERNEL_PACKAGE = "linux-image-amd64"

#: what the initramfs loads at boot; ``sha512_generic``, not ``sha512``: the alias picks
#: the SSSE3 variant, which the emulated CPU lacks, and SMB 3.1.1 signing needs it
MODULES = [
    "virtio_pci", "virtio_net", "nfsv3", "cifs", "gcm", "ccm", "cmac", "sha512_generic", "ecb",
    "ctr", "ghash_generic", "des_generic", "nls_utf8", "9p", "9pnet_virtio",
]  # fmt: skip

#: the guest's PID 1. The job's script writes to the second serial port (kept free of
#: kernel messages), the exit status goes to the console as the last thing it prints.
INIT = """#!/bin/busybox sh
/bin/busybox --install -s
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
# cifs request_module()s its crypto at mount time
echo /sbin/modprobe > /proc/sys/kernel/modprobe
for m in $(cat /etc/modules); do modprobe $m || echo "modprobe $m failed"; done
. /job/env
ip link set lo up; ip link set eth0 up; ip addr add "$GUEST_IP/24" dev eth0
if [ -n "$SHARE" ]; then
    mkdir -p "$SHARE"
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 host "$SHARE" || echo "9p failed"
fi
echo "LOOMFS-GUEST-UP uptime=$(cut -d' ' -f1 /proc/uptime)"
stty -F /dev/ttyS1 raw -echo
(cd /tmp && exec sh /job/test.sh) </dev/null >/dev/ttyS1 2>&1
rc=$?
[ -n "$SHARE" ] && umount "$SHARE"
echo "LOOMFS-GUEST-RC=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
sync
poweroff -f
"""


@dataclass(frozen=True)
class BootImage:
    """A kernel to boot (uncompressed ELF) and the initramfs that goes with it."""

    kernel_version: str
    vmlinux: Path
    initramfs: Path


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loomfs-guest"


def require(*programs: str, hint: str = INSTALL_HINT) -> None:
    """Fail, saying how to install them, unless every program is on PATH."""
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        raise RuntimeError(f"the guest needs {', '.join(missing)}: {hint}")


def _static_busybox() -> Path:
    require("busybox")
    path = Path(os.path.realpath(shutil.which("busybox") or ""))
    ldd = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
    # a dynamic busybox would find no C library in the initramfs
    if "not a dynamic executable" not in ldd.stdout + ldd.stderr:
        raise RuntimeError(f"{path} is dynamically linked: {INSTALL_HINT}")
    return path


def _kernel_package() -> tuple[str, str]:
    """The versioned package the metapackage depends on now, and its version."""
    require("apt-cache", "apt-get", "dpkg-deb", hint="the guest kernel comes from Debian's apt")
    shown = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", KERNEL_PACKAGE],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    # "Depends: linux-image-6.1.0-57-amd64 (= 6.1.192-3)"
    for line in shown.splitlines():
        if line.startswith("Depends: linux-image-") and "(= " in line:
            name, version = line.removeprefix("Depends: ").split(",")[0].split(" (= ")
            return name, version.rstrip(")")
    raise RuntimeError(
        f"apt knows no {KERNEL_PACKAGE}: run `apt-get update` (Debian 12 sources needed)"
    )


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold the cache's lock: two tests starting at once build the image only once."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def boot_image(cache: Path | None = None) -> BootImage:
    """The cached boot image, for Debian's current kernel when nothing is cached yet."""
    require("qemu-system-x86_64", "modprobe", "depmod")
    busybox = _static_busybox()
    root = cache or cache_root()
    # a kernel once downloaded stays the guests' kernel (asking apt costs seconds per
    # guest, and tests keep one kernel); emptying the cache moves to Debian's current one
    downloaded = sorted(root.glob("linux-image-*/kernel.deb"), key=lambda deb: deb.stat().st_mtime)
    if downloaded:
        base = downloaded[-1].parent
        package = base.name.split("_", 1)[0]
    else:
        package, version = _kernel_package()
        base = root / f"{package}_{version}"
    # this file says what goes into the initramfs: a change to it makes a new one
    contents = hashlib.sha256(Path(__file__).read_bytes() + busybox.read_bytes())
    initramfs = base / f"initramfs-{contents.hexdigest()[:12]}.cpio"
    vmlinux = base / "vmlinux"
    with _locked(base):
        deb = base / "kernel.deb"
        if not deb.exists() or not vmlinux.exists() or not initramfs.exists():
            with tempfile.TemporaryDirectory(prefix="loomfs-guest-", dir=base) as tmp:
                work = Path(tmp)
                if not deb.exists():
                    _download(package, work, deb)
                root = work / "root"
                subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
                kver = next((root / "lib/modules").iterdir()).name
                if not vmlinux.exists():
                    _atomic_write(vmlinux, _uncompressed_kernel(root / f"boot/vmlinuz-{kver}"))
                if not initramfs.exists():
                    _atomic_write(initramfs, _initramfs(root, kver, busybox))
    return BootImage(package.removeprefix("linux-image-"), vmlinux, initramfs)


def _download(package: str, work: Path, deb: Path) -> None:
    done = subprocess.run(
        ["apt-get", "download", package], cwd=work, capture_output=True, text=True, check=False
    )
    found = list(work.glob(f"{package}_*.deb"))
    if done.returncode != 0 or not found:
        raise RuntimeError(
            f"`apt-get download {package}` failed (network or apt sources?): {done.stderr[-800:]}"
        )
    found[0].replace(deb)


def _atomic_write(path: Path, data: bytes) -> None:
    part = path.with_suffix(".part")
    part.write_bytes(data)
    part.replace(path)


def _uncompressed_kernel(vmlinuz: Path) -> bytes:
    """The ELF inside the bzImage: booted through its PVH entry, it skips the XZ
    decompression that costs ~20 s of emulated CPU at every boot."""
    data = vmlinuz.read_bytes()
    start = data.find(b"\xfd7zXZ\x00")
    if start < 0:
        raise RuntimeError(f"{vmlinuz} has no XZ payload (not a Debian generic kernel?)")
    elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
    if elf[:4] != b"\x7fELF":
        raise RuntimeError(f"{vmlinuz}'s payload is not an ELF kernel")
    return elf


_SIGNATURE = b"~Module signature appended~\n"


def _unsigned(module: bytes) -> bytes:
    """A module without its appended signature (the kernel then loads it, tainted "E",
    where a signature from another key would be refused)."""
    if not module.endswith(_SIGNATURE):
        return module
    (length,) = struct.unpack(">I", module[-len(_SIGNATURE) - 4 : -len(_SIGNATURE)])
    return module[: -(len(_SIGNATURE) + 12 + length)]


def _initramfs(kroot: Path, kver: str, busybox: Path) -> bytes:
    subprocess.run(["depmod", "-b", str(kroot), kver], check=True)
    with tempfile.TemporaryDirectory(prefix="initramfs-", dir=kroot.parent) as tmp:
        stage = Path(tmp)
        # "job": the kernel makes no parents for the job's archive, appended later
        dirs = ("bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "etc", "tmp", "mnt")
        for name in (*dirs, "job"):
            (stage / name).mkdir(parents=True)
        shutil.copy(busybox, stage / "bin/busybox")
        modules = kroot / "lib/modules" / kver
        target = stage / "lib/modules" / kver
        for name in MODULES:
            shown = subprocess.run(
                ["modprobe", "-d", str(kroot), "-S", kver, "--show-depends", name],
                capture_output=True,
                text=True,
                check=False,
            )
            if shown.returncode != 0:
                raise RuntimeError(f"kernel {kver} has no module {name}: {shown.stderr}")
            for line in shown.stdout.splitlines():
                word, path = line.split()[:2]
                if word != "insmod":  # "builtin NAME": nothing to copy
                    continue
                rel = Path(path).relative_to(modules)
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                (target / rel).write_bytes(_unsigned(Path(path).read_bytes()))
        for meta in ("modules.builtin", "modules.builtin.modinfo", "modules.order"):
            shutil.copy(modules / meta, target / meta)
        subprocess.run(["depmod", "-b", str(stage), kver], check=True)
        (stage / "etc/modules").write_text(" ".join(MODULES) + "\n")
        # the users a test names (`id -u nobody`, as pjdfstest does), nothing else
        (stage / "etc/passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
        )
        (stage / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
        (stage / "init").write_text(INIT)
        (stage / "init").chmod(0o755)
        return cpio(_tree(stage))


#: an entry of a cpio archive: its path, mode (type and permissions) and contents
Entry = tuple[str, int, bytes]


def _tree(root: Path) -> Iterator[Entry]:
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            path = Path(directory) / name
            mode = path.lstat().st_mode
            data = b"" if stat.S_ISDIR(mode) else path.read_bytes()
            yield str(path.relative_to(root)), mode, data


def cpio(entries: Iterable[Entry]) -> bytes:
    """A newc ("070701") archive, the format the kernel unpacks as an initramfs;
    archives appended to one another are unpacked in turn, later files winning."""
    out = bytearray()
    records = [*entries, ("TRAILER!!!", 0, b"")]
    for ino, (name, mode, data) in enumerate(records, start=1):
        encoded = name.encode() + b"\0"
        nlink = 2 if stat.S_ISDIR(mode) else 1
        fields = (ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out += b"070701" + b"".join(b"%08X" % value for value in fields) + encoded
        out += b"\0" * (-len(out) % 4) + data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)
