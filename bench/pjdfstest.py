"""pjdfstest inside a loomfs mount of a posix volume (conformance run, beside the benches).

Builds pjdfstest from a checkout given on the command line (``git clone
https://github.com/pjd/pjdfstest``; its code is never copied into this repository) in a
scratch directory, mounts a fresh site with ``--allow-other`` (the tests switch uid/gid;
``default_permissions`` is always on), runs ``prove -r`` as root inside the mount, and
prints the pass rate of subtests with every failing test file. Results feed
docs/COMPATIBILITY.md.

    sudo python bench/pjdfstest.py --source ~/src/pjdfstest [--only chmod,rename] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from loomfs.testing.fuse import MountProcess, prepare_site

#: prove's summary line for a failing file: "path (Wstat: 0 Tests: 119 Failed: 80)"
_FAILED = re.compile(r"^(\S+\.t)\s+\(Wstat: (\d+).*?Tests: (\d+) Failed: (\d+)\)")
_TOTAL = re.compile(r"^Files=(\d+), Tests=(\d+)")


def build(source: Path, scratch: Path, *, static: bool = False) -> Path:
    """pjdfstest built in ``scratch``; ``static`` for a machine without this one's libc
    (bench/pjdfstest_nfs.py's guest)."""
    tree = scratch / "pjdfstest"
    shutil.copytree(source, tree, ignore=shutil.ignore_patterns(".git"))
    configure = ["./configure", *(["LDFLAGS=-static"] if static else [])]
    for step in (["autoreconf", "-ifs"], configure, ["make", "pjdfstest"]):
        subprocess.run(step, cwd=tree, check=True, capture_output=True)
    return tree


def run(source: Path, only: list[str], verbose: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="loomfs-pjdfstest-") as tmp:
        scratch = Path(tmp)
        os.chmod(scratch, 0o755)  # the tests' other uids must reach the mount
        tree = build(source, scratch)
        vol = scratch / "vol"
        vol.mkdir(mode=0o755)
        config = prepare_site(scratch, {"/vol": vol})
        suites = [str(tree / "tests" / name) for name in only] or [str(tree / "tests")]
        with MountProcess(config, scratch / "mnt", "--allow-other") as mount:
            proc = subprocess.run(
                ["prove", "-r", *(["-v"] if verbose else []), *suites],
                cwd=scratch / "mnt/vol",
                capture_output=True,
                text=True,
                check=False,
            )
            log_tail = mount.log()[-5000:]
    failures: list[dict[str, Any]] = []
    total = 0
    for line in proc.stdout.splitlines():
        if match := _FAILED.match(line.strip()):
            path, wstat, tests, failed = match.groups()
            if int(failed) == 0 and int(wstat) == 0:
                continue  # listed only for "TODO passed": more than Linux is expected to do
            failures.append(
                {
                    "test": path.split("/tests/", 1)[-1],
                    "tests": int(tests),
                    "failed": int(failed),
                    "wstat": int(wstat),
                }
            )
        elif match := _TOTAL.match(line):
            total = int(match.group(2))
    failed = sum(f["failed"] for f in failures)
    return {
        "subtests": total,
        "failed": failed,
        "pass_rate": (total - failed) / total if total else 0.0,
        "failures": failures,
        "bailed_out": "Bailout called" in proc.stdout,
        # with --verbose: each failing subtest with the file it is in (the reasons)
        "not_ok": _not_ok(proc.stdout) if verbose else [],
        "mount_log_tail": log_tail,
    }


def _not_ok(output: str) -> list[str]:
    """'file: not ok N - expectation' for every failing subtest of a verbose run."""
    failing: list[str] = []
    current = ""
    for line in output.splitlines():
        if ".t .." in line:  # a file's header, perhaps with its first line after it
            current = line.split(" ..", 1)[0].split("/tests/", 1)[-1]
        elif line.startswith("not ok"):
            failing.append(f"{current}: {line}")
    return failing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="a pjdfstest checkout")
    parser.add_argument("--only", default="", help="comma-separated test groups (chmod,...)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--verbose", action="store_true", help="list every failing subtest")
    args = parser.parse_args()
    result = run(args.source, [g for g in args.only.split(",") if g], args.verbose)
    for line in result["not_ok"]:
        print(f"  {line}")
    for failure in result["failures"]:
        print(f"  {failure['test']:<24} failed {failure['failed']:>5} of {failure['tests']}")
    print(
        f"pjdfstest: {result['subtests'] - result['failed']}/{result['subtests']} subtests "
        f"passed ({100 * result['pass_rate']:.2f}%)"
        + ("; prove bailed out early" if result["bailed_out"] else "")
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
