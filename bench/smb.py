"""SMB throughput: loomfs's share against plain Samba on the same disk, in one run.

smbclient against two smbd's with the same smb.conf, user and accounts
(``loomfs.testing.smb``): one sharing a directory of loomfs's mount of a posix volume (a hub
with ``[smb]``), the other a plain directory on the same disk. Rows: a large file written
(put) and read (get to /dev/null) in MB/s, and small files created per second (one
smbclient session putting many 4 KiB files), and with ``--list N`` the seconds an ``ls``
of a directory of N files takes (made on the disk beforehand, so loomfs assimilates
them). Prints each row with the loomfs/plain ratio; the goal is >= 0.7 on every row
(for seconds, plain/loomfs). Then where loomfs's time went: the FUSE requests of its
mount per put and per listed entry (count and mean milliseconds,
``loomfs_request_seconds{protocol="smb"}``) and the catalog calls. Needs root, samba,
smbclient, libnss-wrapper.

    sudo python bench/smb.py [--size-mb 256] [--files 500] [--list 100000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from loomfs.core.users import SMB_UID_BASE
from loomfs.protocols.smb.conf import GID
from loomfs.testing.smb import PASSWORD, SHARE, USER, loomfs_samba_hub, plain_samba

#: the directory of ``--list``'s files, in each share
MANY = "many"


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


Scrape = tuple[Counter[str], defaultdict[str, float]]


def measure(
    port: int, work: Path, args: argparse.Namespace, probe: Callable[[], Scrape] | None = None
) -> tuple[dict[str, float], list[Scrape]]:
    """The rows, and what ``probe`` read before and after the creates (and the listing)."""
    probed: list[Scrape] = []
    write_s = smbclient(port, "put big.bin big.bin", work)
    read_s = smbclient(port, "get big.bin /dev/null", work)
    puts = "; ".join(f"put small.bin s{i:05d}" for i in range(args.files))
    if probe is not None:
        probed.append(probe())
    create_s = smbclient(port, f"mkdir small; cd small; {puts}", work)
    rows = {
        "write MB/s": args.size_mb / write_s,
        "read MB/s": args.size_mb / read_s,
        "creates/s": args.files / create_s,
    }
    if probe is not None:
        probed.append(probe())
    if args.list:
        rows[f"ls of {args.list} s"] = smbclient(port, f"cd {MANY}; ls", work)
        if probe is not None:
            probed.append(probe())
    return rows, probed


def fill(directory: Path, count: int) -> None:
    """``count`` empty files in ``directory``, the SMB user's."""
    directory.mkdir(parents=True)
    for i in range(count):
        with (directory / f"f{i:06d}").open("wb"):
            pass
        os.chown(directory / f"f{i:06d}", SMB_UID_BASE, GID)
    os.chown(directory, SMB_UID_BASE, GID)


def scrape(url: str) -> Scrape:
    """The hub's SMB mount's FUSE requests and catalog calls so far: counts and seconds."""
    with urllib.request.urlopen(f"{url}/metrics") as reply:
        text = reply.read().decode()
    counts: Counter[str] = Counter()
    seconds: defaultdict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if family.name == "loomfs_request_seconds" and labels.get("protocol") == "smb":
                key = f"fuse {labels['op']}"
            elif family.name == "loomfs_catalog_seconds":
                key = f"catalog {labels['call']}"
            else:
                continue
            if sample.name.endswith("_count"):
                counts[key] += int(sample.value)
            elif sample.name.endswith("_sum"):
                seconds[key] += sample.value
    return counts, seconds


def report(before: Scrape, after: Scrape, what: str, count: int) -> None:
    """The requests and catalog calls between two scrapes, per ``what``, slowest first."""
    (before_n, before_s), (after_n, after_s) = before, after
    print(f"\nper {what} of loomfs's {count}: count, mean ms")
    for key in sorted(after_n - before_n, key=lambda k: -(after_s[k] - before_s[k])):
        n = after_n[key] - before_n[key]
        ms = (after_s[key] - before_s[key]) * 1000 / n
        print(f"  {key:28} {n / count:8.4f}  {ms:7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--list", type=int, default=0, help="files in the listed directory")
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
        if args.list:
            fill(scratch / "plain-share" / MANY, args.list)
            fill(scratch / "vol" / MANY, args.list)
        with plain_samba(scratch) as port:
            print("plain Samba ...", flush=True)
            plain, _ = measure(port, work, args)
        with loomfs_samba_hub(scratch) as (port, hub):
            print("loomfs ...", flush=True)
            loomfs, between = measure(port, work, args, lambda: scrape(hub.url))
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| row | plain Samba | loomfs | loomfs / plain |")
    print("|---|---|---|---|")
    for row, base in plain.items():
        ratio = base / loomfs[row] if row.endswith(" s") else loomfs[row] / base
        print(f"| {row} | {base:.1f} | {loomfs[row]:.1f} | {ratio:.2f}x |")
    report(between[0], between[1], "put", args.files)
    if args.list:
        report(between[1], between[2], "listed entry", args.list)
    if args.json is not None:
        args.json.write_text(json.dumps({"plain": plain, "loomfs": loomfs}, indent=1))


if __name__ == "__main__":
    main()
