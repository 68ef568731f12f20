"""Samba over the namespace (protocol layer): a private loomfs mount, smbd as a child.

``SmbServer`` mounts the namespace in a directory of its own (FUSE, in this process), in
which each share is a directory, and runs ``smbd`` over it, and ``samba-dcerpcd`` (the RPC
services: share listings, user lookups) beside it, rather than letting smbd start it on
demand, when it would leave smbd's process group and outlive a killed hub. Each runs in
a session of its own (smbd signals its whole process group when it exits), is stopped by
its pid, started again if it dies, and told to stop when this process dies without
stopping it. Samba logs a
user in against the NT hash in the registry and runs her session as her uid of the SMB
range (``users.SmbLogin``); the mount maps that uid back to her, so the namespace decides
and audits each call as hers, protocol ``smb``.

Who else could reach the mount: it is served to every uid (``allow_other``, as smbd's
sessions run as many), so the kernel's own check guards the way in. Its directory is
``root:loomfs-smb`` mode 0710: only root and members of that group, which exists only in
the account files smbd is given (nss_wrapper), pass. Root (smbd before it becomes the
user, and any other root process, which could read the volumes' disks anyway) looks
names up and stats them as ``resolver`` (the site itself; a spoke's hub sees the spoke),
since smbd resolves each share's path as root; for anything else it is ``anonymous``,
never the administrator. smbd enters a share as the user, so every directory above the
mount must let her pass: the mount is not in the data directory (often 0700) but in
``RUN_DIR``, under a name derived from the data directory, so that a later start finds
what a crash left there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes.util
import errno
import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ... import paths
from ...config import SmbShare
from ...core.exports import SmbShares, check_share_name
from ...core.types import Principal
from ...core.users import SmbLogin, UserRegistry
from ...errors import ConfigError, LoomError, NotSupported
from ...namespace.base import Namespace
from ..fuse.mount import mounted
from ..fuse.ops import Callers, LoomOperations
from ..fuse.session import Session
from . import conf

log = logging.getLogger(__name__)

#: how often the registry is read for new and changed SMB passwords
REFRESH = 2.0
#: how long smbd may take to listen, and to go on SIGTERM before it is killed
START_TIMEOUT = STOP_TIMEOUT = 30.0
#: the pause before a dead smbd is started again (one that dies at once must not spin)
RESTART_DELAY = 1.0
NSS_WRAPPER = "libnss_wrapper.so"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: where the mounts of SMB servers are (root's, traversable, not listable)
RUN_DIR = Path("/run/loomfs-smb")
SMBD, DCERPCD = "smbd", "samba-dcerpcd"


class SmbServer:
    """smbd serving ``shares`` (name -> namespace directory) of ``namespace`` to the users
    with an SMB password in ``users``; its files under ``state_dir``."""

    def __init__(
        self,
        namespace: Namespace,
        users: UserRegistry,
        shares: Mapping[str, SmbShare],
        *,
        state_dir: Path,
        site: str,
        smbd: str = "smbd",
        resolver: Principal | None = None,
        extended_attributes: bool = True,
        live: SmbShares | None = None,
    ) -> None:
        """``live``: the shares in force, ``shares`` and those added at run time (a hub's),
        taken every ``REFRESH`` seconds and at once on a change made in this process."""
        self.extended_attributes = extended_attributes
        self.namespace = namespace
        #: who smbd's lookups as root run as (``fuse.ops.Callers.resolver``)
        self.resolver = resolver
        self.users = users
        self.site = site
        self.state_dir = state_dir
        self.samba_dir = state_dir / "samba"
        self.fs_dir = mount_dir(state_dir)
        self.mountpoint = self.fs_dir / "mnt"
        self.conf_path = state_dir / "smb.conf"
        self.passdb = self.samba_dir / "private" / "smbpasswd"
        self.accounts = (state_dir / "accounts" / "passwd", state_dir / "accounts" / "group")
        self.shares = self._shares(shares)
        self.live = live
        if live is not None:
            live.changed.append(self.refresh)
        self.smbd = smbd
        #: smb.conf but its shares: what ``start`` decided (host, port, RPC helpers)
        self._conf: dict[str, Any] = {}
        #: the Samba daemons running now, by program (smbd, samba-dcerpcd)
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self._logins: list[SmbLogin] | None = None
        self._ops: LoomOperations | None = None
        self._session: Session | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- start and stop ----------------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Mount, write Samba's files, start smbd on ``host``:``port`` (0: a free one) and
        return the port once it listens."""
        smbd = shutil.which(self.smbd)
        if smbd is None:
            raise NotSupported(f"[smb] needs {self.smbd}: apt-get install samba")
        if ctypes.util.find_library("nss_wrapper") is None:
            raise NotSupported("[smb] needs nss_wrapper: apt-get install libnss-wrapper")
        if os.geteuid() != 0:
            raise NotSupported("[smb] runs smbd as root (it switches to each user's uid)")
        port = port or _free_port(host)
        self._prepare_dirs()
        self._stop_leftovers()
        logins = await self.users.smb_logins()
        self._write_accounts(logins)
        dcerpcd = dcerpcd_of(smbd)  # None: a Samba older than 4.16, which has none
        self._conf = {
            "host": host, "port": port, "state": self.samba_dir, "passdb": self.passdb,
            "extended_attributes": self.extended_attributes, "rpc_on_demand": dcerpcd is None,
        }  # fmt: skip
        await self._take_shares()
        self._write_conf()
        programs = [(SMBD, *smbd_command(smbd, self.conf_path, self.accounts))]
        if dcerpcd is not None:
            programs.append(
                (DCERPCD, *dcerpcd_command(str(dcerpcd), self.conf_path, self.accounts))
            )
        mounted_now: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tasks.append(asyncio.create_task(self._serve_mount(logins, mounted_now)))
        try:
            await mounted_now
            for program, argv, env in programs:
                await self._spawn(program, argv, env)
                self._tasks.append(asyncio.create_task(self._supervise(program, argv, env)))
            self._tasks.append(asyncio.create_task(self._follow_registry()))
            await self._listening(host, port)
        except BaseException:
            await self.stop()  # nothing half started stays: no caller will stop it
            raise
        log.info("smbd serving", extra={"port": port, "pid": self.procs[SMBD].pid})
        return port

    async def stop(self) -> None:
        """Stop smbd (by its pid, then what is left of its process group), then unmount."""
        supervisor = self._tasks[1:]
        for task in supervisor:
            task.cancel()
        await asyncio.gather(*supervisor, return_exceptions=True)
        for proc in self.procs.values():
            await _stop(proc)
        self.procs.clear()
        kill_all(running_with(self.conf_path))  # RPC workers left by a daemon killed
        if self._session is not None:
            self._session.terminate()
        await asyncio.gather(*self._tasks[:1], return_exceptions=True)
        self._tasks.clear()
        with contextlib.suppress(OSError):  # unmounted lazily: still busy, left for later
            self.mountpoint.rmdir()
            self.fs_dir.rmdir()

    def _prepare_dirs(self) -> None:
        for name in conf.STATE_DIRS:
            (self.samba_dir / name).mkdir(parents=True, exist_ok=True)
        os.chmod(self.samba_dir / "private", 0o700)
        self.accounts[0].parent.mkdir(parents=True, exist_ok=True)
        RUN_DIR.mkdir(mode=0o711, exist_ok=True)
        os.chmod(RUN_DIR, 0o711)
        self.fs_dir.mkdir(exist_ok=True)
        os.chown(self.fs_dir, 0, conf.GID)
        os.chmod(self.fs_dir, 0o710)

    def _stop_leftovers(self) -> None:
        """What a hub killed without a chance to stop left: its smbd and smbd's helpers
        (found by this server's own config path) and a dead mount."""
        left = running_with(self.conf_path)
        if left:
            log.warning("stopping Samba processes %s left by a loomfs that did not stop", left)
            kill_all(left)
        try:
            os.stat(self.mountpoint)
            stale = os.path.ismount(self.mountpoint)
        except OSError as exc:
            stale = exc.errno == errno.ENOTCONN
        if stale:
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)],
                           capture_output=True, check=False)  # fmt: skip
        self.mountpoint.mkdir(exist_ok=True)

    # -- shares ------------------------------------------------------------------------------

    def _shares(self, table: Mapping[str, SmbShare]) -> list[conf.Share]:
        return [
            conf.Share(
                check_share_name(name),
                self.mountpoint / paths.normalize(share.path).lstrip("/"),
                share.access == "ro",
            )
            for name, share in sorted(table.items())
        ]

    async def _take_shares(self) -> bool:
        """Take the shares in force now (``live``'s); whether they changed."""
        if self.live is None:
            return False
        try:
            shares = self._shares(await self.live.table())
        except LoomError as exc:  # the catalog out of reach: the shares last taken hold
            log.warning("smb shares not taken", extra={"error": str(exc)})
            return False
        changed, self.shares = shares != self.shares, shares
        return changed

    def _write_conf(self) -> None:
        _replace(self.conf_path, conf.smb_conf(shares=self.shares, **self._conf), 0o644)

    async def refresh(self) -> None:
        """Serve the shares in force now: smb.conf rewritten, smbd told to read it again
        (it tells its sessions: a removed share takes no new tree connection)."""
        if not await self._take_shares() or not self._conf:
            return
        self._write_conf()
        proc = self.procs.get(SMBD)
        if proc is not None and proc.returncode is None:
            await reload_config(self.smbd, self.conf_path, proc.pid)
        log.info("smb shares changed", extra={"shares": [s.name for s in self.shares]})

    # -- the mount ---------------------------------------------------------------------------

    async def _serve_mount(self, logins: list[SmbLogin], ready: asyncio.Future[None]) -> None:
        callers = Callers(
            uid_map=_uid_map(logins), protocol="smb", site=self.site,
            mapped_only=True, kernel_checks=False, resolver=self.resolver,
        )  # fmt: skip
        try:
            async with mounted(
                self.namespace, self.mountpoint, spool_dir=self.state_dir / "spool",
                allow_other=True, callers=callers, protocol="smb", defer_creates=True,
            ) as (session, ops):  # fmt: skip
                self._session, self._ops = session, ops
                ready.set_result(None)
                await session.serve(ops)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            self._session = self._ops = None

    # -- accounts ----------------------------------------------------------------------------

    def _write_accounts(self, logins: list[SmbLogin]) -> None:
        """Samba's password file and the accounts nss_wrapper answers with; each replaced
        whole (smbd reads the password file at each logon and nss_wrapper its files when
        they change, so no restart)."""
        passwd, group = self.accounts
        _replace(passwd, conf.passwd_file(logins), 0o644)
        _replace(group, conf.group_file(logins), 0o644)
        _replace(self.passdb, conf.smbpasswd_file(logins), 0o600)
        self._logins = logins

    async def _follow_registry(self) -> None:
        """New logins, changed passwords and shares added or removed by another process."""
        while True:
            await asyncio.sleep(REFRESH)
            await self.refresh()
            try:
                logins = await self.users.smb_logins()
            except Exception:
                log.exception("could not read the SMB logins; keeping the last ones")
                continue
            if logins != self._logins:
                self._write_accounts(logins)
                if self._ops is not None:
                    self._ops.remap(_uid_map(logins))
                log.info("SMB logins changed", extra={"users": len(logins)})

    # -- smbd --------------------------------------------------------------------------------

    async def _spawn(self, program: str, argv: list[str], env: dict[str, str]) -> None:
        """Start ``program``; samba-dcerpcd only once it serves (it closes the pipe it is
        given then), since smbd answers a client's RPC with nothing while it starts."""
        ready: tuple[int, int] | None = os.pipe() if program == DCERPCD else None
        if ready is not None:
            argv = [*argv, f"--ready-signal-fd={ready[1]}"]
        try:
            # stdin is /dev/null: a foreground smbd exits at EOF when its stdin is a pipe
            with (self.samba_dir / "log" / f"{program}.out").open("ab") as out:
                proc = self.procs[program] = await asyncio.create_subprocess_exec(
                    *argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=env, start_new_session=True, preexec_fn=dying_with(os.getpid()),
                    pass_fds=() if ready is None else (ready[1],),
                )  # fmt: skip
            if ready is not None:
                os.close(ready[1])
                ready = (ready[0], -1)
                await _closed_or_dead(ready[0], proc)
        finally:
            for fd in ready or ():
                if fd >= 0:
                    os.close(fd)

    async def _supervise(self, program: str, argv: list[str], env: dict[str, str]) -> None:
        while True:
            proc = self.procs[program]
            code = await proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its sessions or workers die with it
            log.warning(
                "%s exited (%s): starting it again", program, code,
                extra={"program": program, "code": code},
            )  # fmt: skip
            await asyncio.sleep(RESTART_DELAY)
            await self._spawn(program, argv, env)

    async def _listening(self, host: str, port: int) -> None:
        target = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT
        while True:
            try:
                _, writer = await asyncio.open_connection(target, port)
            except OSError:
                if self.procs[SMBD].returncode is not None or loop.time() > deadline:
                    log_file = self.samba_dir / "log" / "smbd.out"
                    tail = log_file.read_text(errors="replace")[-2000:]
                    raise ConfigError(f"smbd did not start listening on {port}: {tail}") from None
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return


async def reload_config(smbd: str, conf_path: Path, pid: int) -> None:
    """Tell the smbd of ``pid`` to read ``conf_path`` again: its Samba's smbcontrol, whose
    message the parent passes on to every session; where that fails, SIGHUP, by which the
    parent alone reloads (new connections are its children, so they see the change)."""
    found = shutil.which(smbd)
    smbcontrol = None if found is None else Path(found).resolve().parent.parent / "bin"
    command = [str(smbcontrol / "smbcontrol") if smbcontrol else "smbcontrol",
               "--configfile", str(conf_path), str(pid), "reload-config"]  # fmt: skip
    try:
        proc = await asyncio.create_subprocess_exec(
            *command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        said, _ = await proc.communicate()
        if proc.returncode == 0:
            return
        log.warning("smbcontrol failed: sending SIGHUP", extra={"output": said.decode()[-500:]})
    except OSError as exc:
        log.warning("no smbcontrol: sending SIGHUP", extra={"error": str(exc)})
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGHUP)


def smbd_command(
    smbd: str, conf_path: Path, accounts: tuple[Path, Path]
) -> tuple[list[str], dict[str, str]]:
    """smbd's command line and environment: in the foreground, no process group of its
    own making (it is started in a session of its own), its accounts from ``accounts``
    (passwd, group) through nss_wrapper. Start it with ``start_new_session``."""
    return _samba_command(smbd, [], conf_path, accounts)


def dcerpcd_command(
    dcerpcd: str, conf_path: Path, accounts: tuple[Path, Path]
) -> tuple[list[str], dict[str, str]]:
    """samba-dcerpcd's, as smbd's (``smbd_command``), serving every RPC service Samba has."""
    return _samba_command(dcerpcd, ["--libexec-rpcds"], conf_path, accounts)


def dcerpcd_of(smbd: str) -> Path | None:
    """The samba-dcerpcd of the Samba whose smbd is ``smbd`` (in its libexec), if it has one."""
    found = shutil.which(smbd)
    if found is None:
        return None
    prefix = Path(found).resolve().parent.parent  # /usr/sbin/smbd: /usr
    dcerpcd = prefix / "libexec" / "samba" / "samba-dcerpcd"
    return dcerpcd if dcerpcd.is_file() else None


def _samba_command(
    program: str, options: list[str], conf_path: Path, accounts: tuple[Path, Path]
) -> tuple[list[str], dict[str, str]]:
    passwd, group = accounts
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "LD_PRELOAD": NSS_WRAPPER,
        "NSS_WRAPPER_PASSWD": str(passwd),
        "NSS_WRAPPER_GROUP": str(group),
    }
    argv = [program, *options, "--foreground", "--no-process-group", "--debug-stdout",
            "--configfile", str(conf_path)]  # fmt: skip
    return argv, env


def dying_with(parent: int) -> Callable[[], None]:
    """What a child runs before it executes its program so that it gets SIGTERM when
    ``parent`` dies, however (a SIGKILLed hub): smbd would serve on, over a dead mount,
    until the next start found it. SIGTERM, not SIGKILL: smbd then ends its sessions (its
    process group). The kernel sends it when the thread that started the child ends: the
    event loop's. A parent already gone before the child asked is checked for."""
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0 or os.getppid() != parent:
            os._exit(1)

    return preexec


def mount_dir(state_dir: Path) -> Path:
    """The directory of the mount of the SMB server whose state is in ``state_dir``."""
    return RUN_DIR / hashlib.sha256(os.fsencode(state_dir.resolve())).hexdigest()[:16]


def running_with(conf_path: Path) -> list[int]:
    """The pids of the processes started with ``conf_path`` as their Samba config: smbd
    and the RPC helpers it starts on demand (``samba-dcerpcd``), which leave its process
    group and outlive it. The path is this server's own, so they are all its own."""
    wanted = {os.fsencode(f"--configfile={conf_path}"), os.fsencode(str(conf_path))}
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if len(argv) > 1 and wanted.intersection(argv):
            found.append(int(entry.name))
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _uid_map(logins: list[SmbLogin]) -> dict[int, str]:
    return {login.uid: login.user for login in conf.users_of(logins)}


def _replace(path: Path, text: str, mode: int) -> None:
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    os.chmod(partial, mode)
    partial.replace(path)


def _free_port(host: str) -> int:
    """A port free now on ``host``: smbd takes a number, never 0."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


async def _closed_or_dead(fd: int, proc: asyncio.subprocess.Process) -> None:
    """Until the pipe's other end ``fd`` reads is closed, or ``proc`` exits (its
    supervisor starts it again), or START_TIMEOUT passes (it is slow, not broken)."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    loop.add_reader(fd, lambda: None if readable.done() else readable.set_result(None))
    exited = asyncio.ensure_future(proc.wait())
    try:
        await asyncio.wait([readable, exited], timeout=START_TIMEOUT,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    finally:
        loop.remove_reader(fd)
        readable.cancel()
        exited.cancel()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM smbd by its pid, SIGKILL if it lingers, then whatever of its process group
    (its sessions, samba-dcerpcd) is left."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
