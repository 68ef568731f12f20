"""The FUSE mount next to the local disk it serves, in one run (bench).

1. Sequential read of one large file with ``dd bs=1M``: the volume's file read locally
   (warm: in the page cache), through the mount the first time (every read goes through
   the Python daemon, the source itself warm), and through the mount again (served from
   the kernel's page cache, kept because the version did not change).
2. Metadata: create (open O_CREAT + close), stat and unlink N empty files in one
   directory, on the mount and on the local disk.

Goals (issue 7): warm sequential read >= 0.8x local; metadata >= 1.0x JuiceFS (not run
here). Prints each figure and the ratio to local.

    python bench/fuse.py [--quick] [--json out.json] [--size-mib N] [--files N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loomfs.testing.fuse import MountProcess, prepare_site

MIB = 1 << 20


def write_file(path: Path, size_mib: int) -> None:
    block = os.urandom(MIB)
    with path.open("wb") as f:
        for _ in range(size_mib):
            f.write(block)


def dd_read(path: Path) -> float:
    """Seconds ``dd`` takes to read the whole file into /dev/null with 1 MiB blocks."""
    start = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    return time.perf_counter() - start


def metadata(directory: Path, files: int) -> dict[str, float]:
    """Operations per second of create, stat and unlink of ``files`` empty files."""
    names = [str(directory / f"f{i:06d}") for i in range(files)]

    def rate(op: Callable[[str], object]) -> float:
        start = time.perf_counter()
        for name in names:
            op(name)
        return files / (time.perf_counter() - start)

    flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL
    return {
        "create": rate(lambda n: os.close(os.open(n, flags, 0o644))),
        "stat": rate(os.stat),
        "unlink": rate(os.unlink),
    }


def run(size_mib: int, files: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="loomfs-bench-fuse-") as tmp:
        root = Path(tmp)
        vol = root / "vol"
        vol.mkdir()
        write_file(vol / "big.bin", size_mib)
        (vol / "meta").mkdir()
        local_meta = root / "local-meta"
        local_meta.mkdir()
        config = prepare_site(root, {"/vol": vol})
        with MountProcess(config, root / "mnt") as mount:
            mounted = root / "mnt/vol"
            dd_read(vol / "big.bin")  # warm the source in the page cache
            local = dd_read(vol / "big.bin")
            first = dd_read(mounted / "big.bin")
            warm = dd_read(mounted / "big.bin")
            meta_mount = metadata(mounted / "meta", files)
            meta_local = metadata(local_meta, files)
            assert "Traceback" not in mount.log(), mount.log()
    mb = size_mib * MIB / 1e6
    read = {
        "local_MBps": mb / local,
        "mount_first_MBps": mb / first,
        "mount_warm_MBps": mb / warm,
    }
    read["first_ratio"] = read["mount_first_MBps"] / read["local_MBps"]
    read["warm_ratio"] = read["mount_warm_MBps"] / read["local_MBps"]
    meta: dict[str, float] = {}
    for op in ("create", "stat", "unlink"):
        meta[f"{op}_mount_ops"] = meta_mount[op]
        meta[f"{op}_local_ops"] = meta_local[op]
        meta[f"{op}_ratio"] = meta_mount[op] / meta_local[op]
    return {
        "size_mib": size_mib,
        "files": files,
        "cpus": os.cpu_count(),
        "read": read,
        "metadata": meta,
    }


def report(result: dict[str, Any]) -> None:
    read, meta = result["read"], result["metadata"]
    print(f"sequential read of {result['size_mib']} MiB (dd bs=1M):")
    print(f"  local disk (warm)        {read['local_MBps']:9.0f} MB/s")
    print(
        f"  mount, through daemon    {read['mount_first_MBps']:9.0f} MB/s"
        f"  ratio {read['first_ratio']:.2f}"
    )
    print(
        f"  mount, page cache (warm) {read['mount_warm_MBps']:9.0f} MB/s"
        f"  ratio {read['warm_ratio']:.2f}  (goal >= 0.80)"
    )
    print(f"metadata, {result['files']} empty files in one directory (ops/s):")
    for op in ("create", "stat", "unlink"):
        print(
            f"  {op:<7} mount {meta[f'{op}_mount_ops']:9.0f}   local "
            f"{meta[f'{op}_local_ops']:9.0f}   ratio {meta[f'{op}_ratio']:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB and 1,000 files")
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    size, files = (256, 1000) if args.quick else (args.size_mib, args.files)
    result = run(size, files)
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
