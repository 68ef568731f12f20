"""NFS throughput: loomfs's NFSv3 server against nfs-ganesha on the same disk, in one guest.

One QEMU guest of ``loomfs.testing.guest`` (the stock Linux kernel NFS client) mounts, in
turn, nfs-ganesha (VFS FSAL, with rpcbind: the Kubernetes recipe's bare
``vers=3,proto=tcp,nolock``) exporting a plain directory, and a loomfs hub
(``loomfs.testing.guesthub``) exporting a posix volume in a sibling directory of the same
disk (the recipe's options plus ``port=,mountport=``). Rows: a large file written
(``dd conv=fsync``) and read after a remount (so from the server) in MB/s; 2,000 empty
files created, looked up after a remount (``[ -e ]``: LOOKUP and GETATTR) and unlinked
(one ``rm``) per second. Rounds alternate which server goes first; a row is a server's
total over its rounds. Times come from the guest's clock (/proc/uptime, 10 ms); the
guest's emulated CPU limits both servers alike. Prints each row with the loomfs/ganesha
ratio (goal: >= 0.8). Then, on the host (in the guest's namespace), libnfs's userspace
``nfs-cp`` writes a random file of the same size to each server and reads it back (MB/s,
rounds alternating likewise). Last, in a second boot, a spoke of the hub (in the same
namespace, over the fabric link on its loopback) serves /x over NFS: the guest reads the
first of those files cold (misses, over the link) and warm (after a remount, from the
spoke's cache); both rows are set against ganesha's read. Needs root, libnfs-utils,
qemu-system-x86, nfs-ganesha, rpcbind.

    sudo env PYTHONPATH=src python bench/nfs.py [--size-mb 256] [--files 2000] \
        [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from loomfs.testing.guest import Ganesha, Guest
from loomfs.testing.guesthub import GuestHub
from loomfs.testing.nfs import libnfs_tool

ROWS = {"write": "write MB/s", "read": "read MB/s", "create": "creates/s",
        "stat": "stats/s", "unlink": "unlinks/s",
        "cold": "read MB/s, cache cold", "warm": "read MB/s, cache warm"}  # fmt: skip


def script(label: str, mount: str, size_mb: int, files: int) -> str:
    """The guest's runs on one server, each printed as ``label row start end``."""
    remount = f"umount /m; {mount}"
    return f"""
mkdir -p /m
{mount}
a=$(t); dd if=/dev/zero of=/m/big.bin bs=1M count={size_mb} conv=fsync 2>/dev/null; b=$(t)
echo "{label} write $a $b"
{remount}
a=$(t); dd if=/m/big.bin of=/dev/null bs=1M 2>/dev/null; b=$(t)
echo "{label} read $a $b"
mkdir /m/s
a=$(t); i=0; while [ $i -lt {files} ]; do i=$((i + 1)); : > /m/s/$i; done; b=$(t)
echo "{label} create $a $b"
{remount}
a=$(t); i=0; while [ $i -lt {files} ]; do i=$((i + 1)); [ -e /m/s/$i ]; done; b=$(t)
echo "{label} stat $a $b"
set -- /m/s/*
a=$(t); rm "$@"; b=$(t)
echo "{label} unlink $a $b"
[ -z "$(ls /m/s)" ] && echo "{label} emptied"
rm /m/big.bin; rmdir /m/s
umount /m
"""


#: a spoke of the loomfs hub, its cache empty, serving the hub's /x over NFS: the guest
#: reads the first file nfs-cp wrote to loomfs (turn 1: ganesha has turn 0) cold (a miss:
#: over the link) and again after a remount (warm: from the spoke's cache)
SPOKE = """set -eu
t() {{ cut -d' ' -f1 /proc/uptime; }}
mkdir -p /m
{mount}
a=$(t); dd if=/m/host-1.bin of=/dev/null bs=1M 2>/dev/null; b=$(t)
echo "spoke cold $a $b"
umount /m; {mount}
a=$(t); dd if=/m/host-1.bin of=/dev/null bs=1M 2>/dev/null; b=$(t)
echo "spoke warm $a $b"
umount /m
"""


def rates(output: str, size_mb: int, files: int) -> dict[str, dict[str, float]]:
    """Each server's rows from the guest's lines (MB/s or operations per second), over
    all of its rounds."""
    seconds: dict[tuple[str, str], list[float]] = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[1] not in ROWS:
            continue
        label, row, start, end = parts
        seconds.setdefault((label, row), []).append(max(float(end) - float(start), 0.01))
    result: dict[str, dict[str, float]] = {}
    for (label, row), took in seconds.items():
        amount = size_mb if row in ("write", "read", "cold", "warm") else files
        result.setdefault(label, {})[ROWS[row]] = amount * len(took) / sum(took)
    return result


def host_copies(
    guest: Guest, urls: dict[str, str], source: Path, rounds: int
) -> dict[str, dict[str, float]]:
    """libnfs's nfs-cp (userspace, in the guest's namespace on the host) writing ``source``
    to each server and reading it back, in MB/s; rounds alternate the order as above.
    ``urls`` are the servers' libnfs URLs with ``{name}`` for the file's name."""
    tool = libnfs_tool("nfs-cp")
    size_mb = source.stat().st_size / (1 << 20)
    seconds: dict[tuple[str, str], float] = {}
    order = [list(urls), list(urls)[::-1]] * rounds
    for turn, label in enumerate(name for pair in order[:rounds] for name in pair):
        back = source.with_name(f"back-{label}.bin")
        # nfs-cp creates exclusively (it will not overwrite): a new name each turn
        url = urls[label].format(name=f"host-{turn}.bin")
        copies = {"write": [str(source), url], "read": [url, str(back)]}
        for row, copy in copies.items():
            start = time.perf_counter()
            done = subprocess.run(guest.command([tool, *copy]), capture_output=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{label}: nfs-cp {row} failed: {done.stderr.decode()[-2000:]}")
            key = (label, f"host nfs-cp {row} MB/s")
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start
        if back.read_bytes() != source.read_bytes():
            raise SystemExit(f"{label}: nfs-cp read back other bytes than it wrote")
        back.unlink()
    result: dict[str, dict[str, float]] = {}
    for (label, row), took in seconds.items():
        result.setdefault(label, {})[row] = size_mb * rounds / took
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2, help="of both servers, in turn")
    parser.add_argument("--quick", action="store_true", help="16 MiB, 200 files, one round")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.size_mb, args.files, args.rounds = 16, 200, 1
    size_mb, files = args.size_mb, args.files
    with tempfile.TemporaryDirectory(prefix="loomfs-bench-nfs-") as tmp:
        scratch = Path(tmp)
        plain, volume = scratch / "ganesha", scratch / "loomfs"
        plain.mkdir()
        volume.mkdir()
        with (
            Guest(memory_mb=1024, timeout=3600) as guest,
            Ganesha(guest, plain) as ganesha,
            GuestHub(
                guest, scratch / "site", volume, nfs_port=2050, spoke_dir=scratch / "spoke"
            ) as hub,
        ):
            runs = {"ganesha": ganesha.export.mount("/m"), "loomfs": hub.export().mount("/m")}
            # rounds alternate which server goes first (ABBA...): a load that changes
            # during the run weighs on both alike
            order = [["ganesha", "loomfs"], ["loomfs", "ganesha"]] * args.rounds
            body = "set -eu\nt() { cut -d' ' -f1 /proc/uptime; }\n"
            for label in (name for pair in order[: args.rounds] for name in pair):
                body += script(label, runs[label], size_mb, files)
            result = guest.run(body)
            source = scratch / "host.bin"
            with source.open("wb") as out:
                for _ in range(size_mb):
                    out.write(os.urandom(1 << 20))
            where = f"nfs://{guest.host_ip}"
            copies = host_copies(guest, {
                "ganesha": f"{where}{ganesha.export.path}/{{name}}?version=3&uid=0&gid=0",
                "loomfs": f"{where}/x/{{name}}?version=3&nfsport=2050&mountport=2050&uid=0&gid=0",
            }, source, args.rounds)  # fmt: skip
            with hub.spoke(2051):
                cached = guest.run(SPOKE.format(mount=hub.export("/x", 2051).mount("/m")))
    for label in ("ganesha", "loomfs"):
        if result.output.splitlines().count(f"{label} emptied") != args.rounds:
            raise SystemExit(f"{label}: the unlinks left files behind\n{result.output}")
    measured = rates(result.output, size_mb, files)
    for label, rows in copies.items():
        measured[label] |= rows
    spoke = rates(cached.output, size_mb, files)["spoke"]
    measured["ganesha"] |= {f"spoke {row}": measured["ganesha"]["read MB/s"] for row in spoke}
    measured["loomfs"] |= {f"spoke {row}": value for row, value in spoke.items()}
    print(f"{size_mb} MiB, {files} files, {args.rounds} rounds: guest {result.seconds:.0f} s")
    print("| row | nfs-ganesha | loomfs | loomfs / ganesha |")
    print("|---|---|---|---|")
    for row in measured["ganesha"]:
        base, ours = measured["ganesha"][row], measured["loomfs"][row]
        print(f"| {row} | {base:.1f} | {ours:.1f} | {ours / base:.2f}x |")
    if args.json is not None:
        args.json.write_text(json.dumps(measured, indent=1))


if __name__ == "__main__":
    main()
