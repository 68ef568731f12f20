"""pjdfstest on an NFSv3 mount by the stock Linux client, in the QEMU guest (conformance run,
beside the benches).

Builds pjdfstest statically from a checkout given on the command line (``git clone
https://github.com/pjd/pjdfstest``; its code is never copied into this repository) in a
scratch directory, boots the guest of ``loomfs.testing.guest``, mounts the export with the
Kubernetes recipe's options (``vers=3,proto=tcp,nolock``) and runs every test file as root
on the mount, keeping each file's TAP. The server is nfs-ganesha (VFS FSAL) exporting a
fresh directory: its failures, kept with ``--json``, are the reference of
docs/COMPATIBILITY.md; or, with ``--server loomfs``, a loomfs hub
(``loomfs.testing.guesthub``: a posix volume in a fresh directory, root unsquashed) in the
guest's namespace, and ``--reference`` lists what passed on the reference and fails there.

    sudo env PYTHONPATH=src python bench/pjdfstest_nfs.py --source ~/src/pjdfstest \
        [--server ganesha|loomfs] [--only chmod,rename] [--json out.json] \
        [--reference bench/pjdfstest_nfs_ganesha.json]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from loomfs.testing.guest import Ganesha, Guest, NfsExport
from loomfs.testing.guesthub import GuestHub
from pjdfstest import build

_RESULT = re.compile(r"^(not )?ok (\d+)\b(.*)$")
_PLAN = re.compile(r"^1\.\.(\d+)")


def guest_script(mount: str, files: list[str]) -> str:
    """Each file run from a copy of the tree in the guest's memory (a fork and exec of
    pjdfstest per subtest is cheaper there than over 9p), its TAP written to the share;
    the file's name and exit status printed as it ends."""
    return f"""set -u
cp -r /host/pjdfstest /tmp/pjd
# the suite names files by `openssl md5` of random bytes; busybox has md5sum
mkdir /tmp/pjd/bin
printf '#!/bin/sh\nmd5sum | cut -d" " -f1\n' > /tmp/pjd/bin/openssl
chmod 755 /tmp/pjd/bin/openssl
export PATH=/tmp/pjd/bin:$PATH
mkdir -p /mnt
{mount} || exit 10
cd /mnt
for t in {" ".join(files)}; do
    timeout 900 sh /tmp/pjd/tests/$t > /host/results/$(echo $t | tr / _).tap 2>&1
    echo "$t $?"
done
cd /
# a test may leave a process behind on the mount (ps shows which)
umount /mnt || {{ ps; umount -l /mnt; }}
"""


def parse(tap: str) -> dict[str, Any]:
    """One file's plan and failures, as prove counts them: a "not ok" marked TODO is an
    expected failure, a subtest the plan promises and the output lacks is a failure."""
    plan = 0
    seen: set[int] = set()
    not_ok: list[str] = []
    for line in tap.splitlines():
        if match := _PLAN.match(line):
            plan = int(match.group(1))
        elif match := _RESULT.match(line):
            seen.add(int(match.group(2)))
            if match.group(1) and "# TODO" not in match.group(3):
                not_ok.append(line)
    failed = sorted({int(line.split()[2]) for line in not_ok} | (set(range(1, plan + 1)) - seen))
    return {"plan": max(plan, len(seen)), "failed": failed, "not_ok": not_ok}


def run(guest: Guest, export: NfsExport, tree: Path, only: list[str]) -> dict[str, Any]:
    """pjdfstest's files (``only``: some groups) on ``export``, mounted by ``guest``."""
    tests = tree / "tests"
    files = sorted(
        str(path.relative_to(tests))
        for path in tests.rglob("*.t")
        if not only or path.relative_to(tests).parts[0] in only
    )
    with tempfile.TemporaryDirectory(prefix="loomfs-pjd-share-") as tmp:
        share = Path(tmp)
        (share / "pjdfstest").mkdir()
        shutil.copy(tree / "pjdfstest", share / "pjdfstest/pjdfstest")
        shutil.copytree(tests, share / "pjdfstest/tests")
        (share / "results").mkdir()
        started = time.monotonic()
        result = guest.run(guest_script(export.mount("/mnt"), files), share=share)
        per_file = {}
        for name in files:
            tap = share / "results" / (name.replace("/", "_") + ".tap")
            per_file[name] = parse(tap.read_text(errors="replace") if tap.exists() else "")
    subtests = sum(f["plan"] for f in per_file.values())
    failed = sum(len(f["failed"]) for f in per_file.values())
    return {
        "export": f"{export.host}:{export.path}",
        "options": export.options,
        "kernel": guest.image.kernel_version,
        "seconds": round(time.monotonic() - started),
        "subtests": subtests,
        "failed": failed,
        "files": {name: f for name, f in per_file.items() if f["failed"]},
        "guest_output_tail": result.output[-3000:],
    }


def regressions(reference: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """Subtests that passed in ``reference``'s run and fail in ``result``'s."""
    lost = []
    for name, failure in result["files"].items():
        known = set(reference["files"].get(name, {}).get("failed", []))
        lost += [f"{name} {n}" for n in failure["failed"] if n not in known]
    return lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="a pjdfstest checkout")
    parser.add_argument("--only", default="", help="comma-separated test groups (chmod,...)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--reference", type=Path, help="an earlier --json to compare with")
    parser.add_argument("--timeout", type=float, default=7200.0, help="for the whole guest run")
    parser.add_argument("--server", choices=("ganesha", "loomfs"), default="ganesha")
    args = parser.parse_args()
    only = [group for group in args.only.split(",") if group]
    with tempfile.TemporaryDirectory(prefix="loomfs-pjdfstest-nfs-") as tmp:
        scratch = Path(tmp)
        tree = build(args.source, scratch, static=True)
        exported = scratch / "export"
        exported.mkdir(mode=0o755)
        with Guest(timeout=args.timeout) as guest:
            if args.server == "loomfs":
                with GuestHub(guest, scratch / "site", exported) as hub:
                    result = run(guest, hub.export(), tree, only)
            else:
                with Ganesha(guest, exported) as nfs:
                    result = run(guest, nfs.export, tree, only)
    for name, failure in result["files"].items():
        print(f"  {name:<24} failed {len(failure['failed']):>5} of {failure['plan']}")
        for line in failure["not_ok"]:
            print(f"      {line}")
    passed = result["subtests"] - result["failed"]
    print(
        f"pjdfstest over NFSv3 ({result['options']}, kernel {result['kernel']}): "
        f"{passed}/{result['subtests']} subtests passed in {result['seconds']} s"
    )
    if args.reference:
        lost = regressions(json.loads(args.reference.read_text()), result)
        print(f"{len(lost)} subtests pass on the reference and fail here: {lost}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
