"""SMB throughput: loomfs's share against plain Samba on the same disk, in one run.

smbclient against two smbd's with the same smb.conf, user and accounts
(``loomfs.testing.smb``): one sharing a directory of loomfs's mount of a posix volume (a hub
with ``[smb]``), the other a plain directory on the same disk. Rows: a large file written
(put) and read (get to /dev/null) in MB/s, and small files created per second (one
smbclient session putting many 4 KiB files). Prints each row with the loomfs/plain
ratio; the goal is >= 0.7 on every row. Needs root, samba, smbclient, libnss-wrapper.

    sudo python bench/smb.py [--size-mb 256] [--files 500] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from loomfs.testing.smb import PASSWORD, SHARE, USER, loomfs_samba, plain_samba


def smbclient(port: int, commands: str, cwd: Path) -> float:
    """Seconds one smbclient session takes to run ``commands`` (which must succeed)."""
    argv = ["smbclient", f"//127.0.0.1/{SHARE}", "-p", str(port), "-U", f"{USER}%{PASSWORD}",
            "-t", "600", "-c", commands]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False)
    took = time.perf_counter() - start
    if done.returncode != 0 or "NT_STATUS" in done.stdout:
        raise RuntimeError(f"smbclient failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return took


def measure(port: int, work: Path, size_mb: int, files: int) -> dict[str, float]:
    write_s = smbclient(port, "put big.bin big.bin", work)
    read_s = smbclient(port, "get big.bin /dev/null", work)
    puts = "; ".join(f"put small.bin s{i:05d}" for i in range(files))
    create_s = smbclient(port, f"mkdir small; cd small; {puts}", work)
    return {
        "write MB/s": size_mb / write_s,
        "read MB/s": size_mb / read_s,
        "creates/s": files / create_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="16 MiB and 50 files")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.size_mb, args.files = 16, 50
    with tempfile.TemporaryDirectory(prefix="loomfs-bench-smb-") as tmp:
        scratch = Path(tmp)
        os.chmod(scratch, 0o755)
        work = scratch / "work"
        work.mkdir()
        with (work / "big.bin").open("wb") as f:
            for _ in range(args.size_mb):
                f.write(os.urandom(1 << 20))
        (work / "small.bin").write_bytes(os.urandom(4096))
        with plain_samba(scratch) as port:
            print("plain Samba ...", flush=True)
            plain = measure(port, work, args.size_mb, args.files)
        with loomfs_samba(scratch) as port:
            print("loomfs ...", flush=True)
            loomfs = measure(port, work, args.size_mb, args.files)
    print("| row | plain Samba | loomfs | loomfs / plain |")
    print("|---|---|---|---|")
    for row, base in plain.items():
        print(f"| {row} | {base:.1f} | {loomfs[row]:.1f} | {loomfs[row] / base:.2f}x |")
    if args.json is not None:
        args.json.write_text(json.dumps({"plain": plain, "loomfs": loomfs}, indent=1))


if __name__ == "__main__":
    main()
