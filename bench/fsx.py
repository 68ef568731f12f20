"""fsx (xfstests' file system exerciser) on a loomfs mount: data integrity (issue 7).

fsx keeps a model of what one file must hold and checks every read, the size after every
operation and, at the end, the whole file against it, while it writes, truncates, maps,
reads and (with ``--closeprob``) closes and reopens the file at random. Any difference
is a data-integrity bug; fsx prints the operations that led to it.

A loomfs mount keeps an open file's new bytes in a local buffer until flush, fsync or
close: without ``--fsync`` or ``--closeprob`` fsx mostly checks that buffer and the
kernel's page cache. ``--fsync`` (fsx -y) fsyncs after every write, so each one reaches
the namespace; ``--closeprob`` also reopens the file and drops the kernel's caches (fsx
writes /proc/sys/vm/drop_caches, for the whole machine), so reads come through the mount.

fsx is built from an xfstests checkout given on the command line (``git clone
https://github.com/kdave/xfstests``; its code is never copied into this repository) in a
scratch directory, with gcc and a config.h written here (no autoconf, no libaio, no XFS
headers). The file lies on a fresh site's posix volume mounted with ``loomfs mount``, or
(``--via spoke``) on a mount over a spoke's REST API, the spoke attaching the hub's volume
through an emulated link, or (``--via nfs``, as root) on the NFSv3 export of a hub, mounted
by the stock Linux client in the QEMU guest of ``loomfs.testing.guest`` with the Kubernetes
recipe's options (fsx is then built static and run in the guest; ``--fsync`` makes each
write a COMMIT). fsx's log files stay in the scratch directory, off the mount.

    PYTHONPATH=src python bench/fsx.py --source /tmp/xfstests --ops 100000 [--no-mmap]
        [--fsync] [--closeprob 20] [--seed 1] [--via spoke|nfs]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from loomfs.testing.fuse import MountProcess, prepare_site
from loomfs.testing.guest import Guest
from loomfs.testing.guesthub import GuestHub
from loomfs.testing.sites import spoke_site

#: what fsx.c's global.h includes when autoconf finds it; all present on Linux with glibc
_HAVE = (
    "SYS_TYPES_H SYS_STAT_H SYS_STATVFS_H SYS_TIME_H SYS_IOCTL_H SYS_WAIT_H MALLOC_H DIRENT_H "
    "STDLIB_H UNISTD_H ERR_H ERRNO_H STRING_H SYS_FCNTL_H TIME_H WAIT_H SYS_PARAM_H LIBGEN_H "
    "ASSERT_H STRINGS_H SYS_MMAN_H LINUX_FALLOC_H COPY_FILE_RANGE"
)
#: getopt.h for fsx.c's long options: autoconf's config.h brings it in
_CONFIG_H = "".join(f"#define HAVE_{name} 1\n" for name in _HAVE.split()) + "#include <getopt.h>\n"
#: fsx's last line on success: "All 100000 operations completed A-OK!"
_DONE = re.compile(r"All (\d+) operations completed A-OK!")
#: what fsx found unsupported here and leaves out: "main: filesystem does not support
#: clone range, disabling!" (and the like for fallocate modes, O_DIRECT-only features)
_SKIPPED = re.compile(r"^main: (.+?),? disabling!$", re.M)


def build(source: Path, scratch: Path, *, static: bool = False) -> Path:
    """fsx from ``source`` (an xfstests checkout: ltp/fsx.c, src/global.h, src/statx.h);
    ``static`` for the guest, which has no libc of its own."""
    fsx_c = source / "ltp" / "fsx.c"
    if not fsx_c.exists():
        raise SystemExit(f"{fsx_c} is missing: give --source a checkout of kdave/xfstests")
    if shutil.which("gcc") is None:
        raise SystemExit("gcc is missing: apt-get install -y gcc libc6-dev")
    include = scratch / "include"
    include.mkdir()
    (include / "config.h").write_text(_CONFIG_H)
    binary = scratch / "fsx"
    subprocess.run(
        ["gcc", "-O2", "-D_GNU_SOURCE", "-DNO_XFS", "-w", f"-I{include}",
         f"-I{source / 'src'}", f"-I{source / 'include'}", *(["-static"] if static else []),
         str(fsx_c), "-o", str(binary)],
        check=True,
    )  # fmt: skip
    return binary


@contextlib.contextmanager
def mounted(scratch: Path, via: str) -> Iterator[tuple[Path, MountProcess]]:
    """A loomfs mount; yields (a directory on it where fsx may work, the mount)."""
    vol = scratch / "vol"
    vol.mkdir()
    if via == "hub":
        config = prepare_site(scratch, {"/vol": vol})
        with MountProcess(config, scratch / "mnt") as mount:
            yield scratch / "mnt" / "vol", mount
        return
    with spoke_site(scratch / "sites", vol, "/vol") as site:
        (scratch / "client").mkdir()
        config = prepare_site(scratch / "client", {})  # the mount's own spool only
        with MountProcess(config, scratch / "mnt", "--hub", site.spoke.url) as mount:
            yield scratch / "mnt" / "vol", mount


def run(
    source: Path,
    ops: int,
    seed: int,
    *,
    mmap: bool,
    fsync: bool,
    closeprob: int,
    via: str,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="loomfs-fsx-") as tmp:
        scratch = Path(tmp)
        fsx = build(source, scratch, static=via == "nfs")
        logs = scratch / "share" / "logs"
        logs.mkdir(parents=True)
        argv = ["-N", str(ops), "-S", str(seed)]
        if not mmap:
            argv += ["-R", "-W"]
        if fsync:
            argv += ["-y"]
        if closeprob:
            argv += ["-c", str(closeprob)]
        argv += extra
        if via == "nfs":
            returncode, output, log_tail = _over_nfs(scratch, fsx, argv)
        else:
            with mounted(scratch, via) as (directory, mount):
                proc = subprocess.run(
                    [str(fsx), *argv, "-P", str(logs), str(directory / "fsx.data")],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                log_tail = mount.log()[-5000:]
            returncode, output = proc.returncode, proc.stdout + proc.stderr
        done = _DONE.search(output)
        return {
            "argv": " ".join(argv),
            "via": via,
            "ops": ops,
            "seed": seed,
            "passed": returncode == 0 and done is not None,
            "completed": int(done.group(1)) if done else None,
            "unsupported": sorted(set(_SKIPPED.findall(output))),
            "output_tail": output[-6000:],
            "fsxlog_tail": _tail(logs / "fsx.data.fsxlog"),
            "mount_log_tail": log_tail,
        }


def _over_nfs(scratch: Path, fsx: Path, argv: list[str]) -> tuple[int, str, str]:
    """fsx in the guest on a hub's NFS export: (its exit status, its output, the hub's log)."""
    share = scratch / "share"
    shutil.copy(fsx, share / "fsx")
    exported = scratch / "export"
    exported.mkdir(mode=0o755)
    with Guest(timeout=3600) as guest, GuestHub(guest, scratch / "site", exported) as hub:
        mount = hub.export().mount("/mnt")
        script = f"""mkdir -p /mnt
{mount} || exit 10
/host/fsx {shlex.join(argv)} -P /host/logs /mnt/fsx.data > /host/out.txt 2>&1
echo $? > /host/rc
umount /mnt
"""
        guest.run(script, share=share)
        log_tail = hub.hub.log_path.read_text(errors="replace")[-5000:]
    rc = share / "rc"
    return int(rc.read_text()) if rc.exists() else -1, _tail(share / "out.txt"), log_tail


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-6000:] if path.exists() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="an xfstests checkout")
    parser.add_argument("--ops", type=int, default=100_000, help="operations (fsx -N)")
    parser.add_argument("--seed", type=int, default=1, help="fsx's random seed (-S)")
    parser.add_argument("--no-mmap", action="store_true", help="no mapped reads/writes (-R -W)")
    parser.add_argument("--fsync", action="store_true", help="fsync after every write (-y)")
    parser.add_argument(
        "--closeprob", type=int, default=0, help="close and reopen once in N ops (-c; 0: never)"
    )
    parser.add_argument("--via", choices=("hub", "spoke", "nfs"), default="hub")
    parser.add_argument(
        "--fsx-args", default="", help="more fsx options: --fsx-args='-l 8388608 -o 1048576'"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    result = run(
        args.source, args.ops, args.seed,
        mmap=not args.no_mmap, fsync=args.fsync, closeprob=args.closeprob, via=args.via,
        extra=shlex.split(args.fsx_args),
    )  # fmt: skip
    if not result["passed"]:
        print(result["output_tail"])
        print(result["mount_log_tail"])
    unsupported = ", ".join(result["unsupported"]) or "none"
    print(
        f"fsx {result['argv']} via {result['via']}: "
        + ("passed" if result["passed"] else "FAILED")
        + f", {result['completed'] or 0} of {result['ops']} operations; "
        f"left out as unsupported by the mount: {unsupported}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    raise SystemExit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
