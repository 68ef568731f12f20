"""How fast the posix backend assimilates a tree, next to `find` and os.walk (bench).

Builds a tree of empty files (or scans the directory given), then times a full
``PosixBackend.scan`` against GNU find printing the same facts (inode, size, mtime) and a
plain os.walk + lstat, and prints entries per second and the ratios. The goal is at least
100,000 entries/s on two cores.

    PYTHONPATH=src python bench/scan_posix.py [--files 200000] [--dir /some/tree]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from loomfs.core.backends.posix import PosixBackend

PER_DIR = 1000


def build(root: str, files: int) -> None:
    for n in range(files):
        if n % PER_DIR == 0:
            directory = Path(root, f"d{n // PER_DIR:05}")
            directory.mkdir()
        (directory / f"f{n:07}.bin").touch()


async def loomfs_scan(root: str) -> int:
    return sum([len(batch) async for batch in PosixBackend(root).scan()])


def find_scan(root: str) -> int:
    out = subprocess.run(
        ["find", root, "-mindepth", "1", "-printf", "%i %s %T@ %p\n"],
        check=True,
        capture_output=True,
    ).stdout
    return out.count(b"\n")


def walk_scan(root: str) -> int:
    count = 0
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lstat(f"{top}/{name}")
            count += 1
    return count


def best_rate(run: Callable[[], int], repeat: int) -> tuple[int, float]:
    best = 0.0
    count = 0
    for _ in range(repeat):
        start = time.perf_counter()
        count = run()
        best = max(best, count / (time.perf_counter() - start))
    return count, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--dir", help="scan this tree instead of building one")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loomfs-bench-") as tmp:
        root = args.dir or tmp
        if not args.dir:
            build(root, args.files)
        results = {
            "loomfs scan": best_rate(lambda: asyncio.run(loomfs_scan(root)), args.repeat),
            "find -printf": best_rate(lambda: find_scan(root), args.repeat),
            "os.walk+lstat": best_rate(lambda: walk_scan(root), args.repeat),
        }
    ours = results["loomfs scan"][1]
    for name, (count, rate) in results.items():
        print(f"{name:14} {count:>9,} entries  {rate:>11,.0f}/s  loomfs/this {ours / rate:5.2f}")


if __name__ == "__main__":
    main()
