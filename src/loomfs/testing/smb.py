"""Two Samba servers side by side, for benchmarks and conformance runs (testing layer):
loomfs's (a hub serving a posix volume over SMB) and plain Samba sharing a local
directory, both with the smb.conf loomfs writes, the same user and nss_wrapper accounts,
so that they differ only in what the share is. Needs root, samba and libnss-wrapper."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from ..core.nthash import nt_hash
from ..core.registry import open_catalog
from ..core.users import SMB_UID_BASE, SmbLogin
from ..hub.namespace import HubNamespace
from ..protocols.smb import conf
from ..protocols.smb.server import kill_all, running_with, smbd_command
from .hubproc import HubProcess, cli_ok
from .ports import free_port

USER, PASSWORD = "torture", "Torture-Pass-1"
#: the share both servers serve
SHARE = "torture"


@contextlib.contextmanager
def plain_samba(scratch: Path) -> Iterator[int]:
    """smbd with loomfs's smb.conf sharing a plain directory as ``SHARE``; its port."""
    state, share = scratch / "plain-state", scratch / "plain-share"
    for name in conf.STATE_DIRS:
        (state / name).mkdir(parents=True, exist_ok=True)
    share.mkdir(exist_ok=True)  # it may hold files already
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
                                       shares=[conf.Share(SHARE, share, False)]))  # fmt: skip
    argv, env = smbd_command("smbd", conf_path, (passwd, group))
    with (state / "log" / "smbd.out").open("ab") as out:
        # stdin never a pipe: a foreground smbd exits at EOF on a pipe
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not _accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (state / "log" / "smbd.out").read_text()[-2000:]
                raise RuntimeError(f"plain smbd did not start: {tail}")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its sessions
        kill_all(running_with(conf_path))  # samba-dcerpcd leaves the group


@contextlib.contextmanager
def loomfs_samba(scratch: Path) -> Iterator[int]:
    """A hub serving a posix volume as ``SHARE`` over SMB; its smbd's port."""
    with loomfs_samba_hub(scratch) as (port, _):
        yield port


@contextlib.contextmanager
def loomfs_samba_hub(scratch: Path) -> Iterator[tuple[int, HubProcess]]:
    """``loomfs_samba``, with the hub too (its metrics; the volume is ``scratch``/vol)."""
    vol = scratch / "vol"
    vol.mkdir(exist_ok=True)  # it may hold files already: they are assimilated
    os.chown(vol, SMB_UID_BASE, conf.GID)  # as the plain share's (the user gets that uid)
    site = scratch / "site"
    site.mkdir()
    asyncio.run(_add_volume(site, vol))
    cli_ok(site, "user", "add", USER, "--offline")
    cli_ok(site, "user", "passwd", USER, "--stdin", "--offline", stdin=f"{PASSWORD}\n".encode())
    config = scratch / "loomfs.toml"
    config.write_text('[hub]\nrescan_interval = 0\n[smb]\nlisten = "127.0.0.1:0"\n'
                      f'[smb.shares]\n{SHARE} = {{ path = "/vol" }}\n')  # fmt: skip
    env = {"LOOMFS_CONFIG": str(config), "LOOMFS_HUB__VOLUME_ROOTS": str(scratch)}
    with HubProcess(site, env=env) as hub:
        yield int(hub.urls["smb"].rpartition(":")[2]), hub


async def _add_volume(site: Path, vol: Path) -> None:
    catalog = open_catalog(f"sqlite://{site / 'catalog.db'}")
    await catalog.open()
    try:
        await HubNamespace(catalog).add_volume("/vol", f"posix://{vol}")
    finally:
        await catalog.close()


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
