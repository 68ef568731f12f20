"""smbtorture's smb2 basic groups against a loomfs share and against plain Samba sharing a
local directory, in one run (conformance, beside the benches; not in make test).

Both smbd's get the same smb.conf (``protocols.smb.conf``: the settings loomfs runs Samba
with), the same user and the same nss_wrapper accounts; they differ only in what the share
is: a directory of loomfs's mount of a posix volume, or a plain directory on the same
disk. Prints one row per test where the two differ and the totals per group; the goal is
that every test passing on plain Samba passes on loomfs. Results feed
docs/COMPATIBILITY.md. Needs root, samba, smbclient, samba-testsuite, libnss-wrapper.

    sudo python bench/smbtorture.py [--groups smb2.connect,smb2.read] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from loomfs.testing.smb import PASSWORD, SHARE, USER, loomfs_samba, plain_samba

GROUPS = (
    "smb2.connect", "smb2.read", "smb2.create", "smb2.dir", "smb2.rename",
    "smb2.delete-on-close-perms", "smb2.getinfo", "smb2.setinfo", "smb2.lock",
)  # fmt: skip
_RESULT = re.compile(r"^(success|failure|error|skip|xfail|uxsuccess): (\S+)")
#: one group may not run longer than this (a test that hangs on one server)
GROUP_TIMEOUT_S = 900


def run_group(group: str, port: int, share: str) -> dict[str, str]:
    """test name -> outcome, from smbtorture's output (a group cut short: "timeout")."""
    argv = ["smbtorture", f"//127.0.0.1/{share}", "-p", str(port),
            "-U", f"{USER}%{PASSWORD}", "--fullname", group]  # fmt: skip
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=GROUP_TIMEOUT_S,
                             check=False).stdout  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return {**_outcomes(out), group: "timeout"}
    return _outcomes(out)


def _outcomes(out: str) -> dict[str, str]:
    """test -> its outcome, with the first line of smbtorture's reason for a failure."""
    found: dict[str, str] = {}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        match = _RESULT.match(line)
        if match:
            outcome, name = match.group(1), match.group(2)
            if outcome in ("failure", "error") and line.endswith("[") and i + 1 < len(lines):
                outcome = f"{outcome}: {lines[i + 1].strip()}"
            found[name] = outcome
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default=",".join(GROUPS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    groups = [g for g in args.groups.split(",") if g]
    results: dict[str, dict[str, dict[str, str]]] = {"plain": {}, "loomfs": {}}
    with tempfile.TemporaryDirectory(prefix="loomfs-smbtorture-") as tmp:
        scratch = Path(tmp)
        os.chmod(scratch, 0o755)
        with plain_samba(scratch) as port:
            for group in groups:
                results["plain"][group] = run_group(group, port, SHARE)
        with loomfs_samba(scratch) as port:
            for group in groups:
                results["loomfs"][group] = run_group(group, port, SHARE)
    print("| group | tests | pass on plain Samba | pass on loomfs | pass on plain, not on loomfs |")
    print("|---|---|---|---|---|")
    for group in groups:
        plain, loom = results["plain"][group], results["loomfs"][group]
        names = sorted(set(plain) | set(loom))
        ok = ("success", "xfail")
        worse = [n for n in names if plain.get(n) in ok and loom.get(n) not in ok]
        print(f"| {group} | {len(names)} | {sum(plain.get(n) in ok for n in names)} | "
              f"{sum(loom.get(n) in ok for n in names)} | {', '.join(worse) or '-'} |")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
