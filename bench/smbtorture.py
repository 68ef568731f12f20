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
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loomfs.core.nthash import nt_hash
from loomfs.core.registry import open_catalog
from loomfs.core.users import SMB_UID_BASE, SmbLogin
from loomfs.hub.namespace import HubNamespace
from loomfs.protocols.smb import conf
from loomfs.protocols.smb.server import smbd_command
from loomfs.testing.hubproc import HubProcess, cli_ok
from loomfs.testing.ports import free_port

GROUPS = (
    "smb2.connect", "smb2.read", "smb2.create", "smb2.dir", "smb2.rename",
    "smb2.delete-on-close-perms", "smb2.getinfo", "smb2.setinfo", "smb2.lock",
)  # fmt: skip
USER, PASSWORD = "torture", "Torture-Pass-1"
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


@contextmanager
def plain_samba(scratch: Path) -> Iterator[int]:
    """smbd with loomfs's smb.conf sharing a plain directory as "torture"; its port."""
    state, share = scratch / "plain-state", scratch / "plain-share"
    for name in conf.STATE_DIRS:
        (state / name).mkdir(parents=True, exist_ok=True)
    share.mkdir()
    os.chown(share, SMB_UID_BASE, conf.GID)  # the share's directory is its user's
    login = SmbLogin(USER, SMB_UID_BASE, nt_hash(PASSWORD), time.time_ns())
    passwd, group = scratch / "passwd", scratch / "group"
    passwd.write_text(conf.passwd_file([login]))
    group.write_text(conf.group_file([login]))
    passdb = state / "private" / "smbpasswd"
    passdb.write_text(conf.smbpasswd_file([login]))
    port = free_port()
    conf_path = scratch / "plain.conf"
    conf_path.write_text(conf.smb_conf(host="127.0.0.1", port=port, state=state, passdb=passdb,
                                       shares=[conf.Share("torture", share, False)]))  # fmt: skip
    argv, env = smbd_command("smbd", conf_path, (passwd, group))
    with (state / "log" / "smbd.out").open("ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    probe = ["smbclient", "-L", "127.0.0.1", "-p", str(port), "-U", f"{USER}%{PASSWORD}"]
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(probe, capture_output=True, check=False).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (state / "log" / "smbd.out").read_text()[-2000:]
                raise RuntimeError(f"plain smbd did not start: {tail}")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its sessions, samba-dcerpcd


@contextmanager
def loomfs_samba(scratch: Path) -> Iterator[int]:
    """A hub serving a posix volume as the share "torture" over SMB; its smbd's port."""
    vol = scratch / "vol"
    vol.mkdir()
    os.chown(vol, SMB_UID_BASE, conf.GID)  # as the plain share's (the user gets that uid)
    site = scratch / "site"
    site.mkdir()
    asyncio.run(_add_volume(site, vol))
    cli_ok(site, "user", "add", USER, "--offline")
    cli_ok(site, "user", "passwd", USER, "--stdin", "--offline", stdin=f"{PASSWORD}\n".encode())
    config = scratch / "loomfs.toml"
    config.write_text('[hub]\nrescan_interval = 0\n[smb]\nlisten = "127.0.0.1:0"\n'
                      '[smb.shares]\ntorture = { path = "/vol" }\n')  # fmt: skip
    env = {"LOOMFS_CONFIG": str(config), "LOOMFS_HUB__VOLUME_ROOTS": str(scratch)}
    with HubProcess(site, env=env) as hub:
        yield int(hub.urls["smb"].rpartition(":")[2])


async def _add_volume(site: Path, vol: Path) -> None:
    catalog = open_catalog(f"sqlite://{site / 'catalog.db'}")
    await catalog.open()
    try:
        await HubNamespace(catalog).add_volume("/vol", f"posix://{vol}")
    finally:
        await catalog.close()


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
                results["plain"][group] = run_group(group, port, "torture")
        with loomfs_samba(scratch) as port:
            for group in groups:
                results["loomfs"][group] = run_group(group, port, "torture")
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
