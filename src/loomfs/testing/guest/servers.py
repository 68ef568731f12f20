"""What a guest mounts, and the reference servers it is compared against (testing layer).

``NfsExport`` and ``SmbShare`` say where a server is and with which options the guest's
kernel mounts it, so one guest script runs against nfs-ganesha, Samba or loomfs alike.
``Ganesha`` (Debian's nfs-ganesha, VFS FSAL, with an rpcbind it registers with) and
``Samba`` (plain smbd, one user, a private state directory) serve a directory of this
machine inside a ``Guest``'s namespace and are stopped by their own pids; another NFS
server finds an rpcbind there with ``start_rpcbind``.
"""

from __future__ import annotations

import pwd
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from .image import require
from .vm import Guest

#: the Kubernetes NFS CSI recipe's mountOptions
SEED_NFS_OPTIONS = "vers=3,proto=tcp,nolock"


@dataclass(frozen=True)
class NfsExport:
    """An NFS export as the guest mounts it. Without an rpcbind at the server, name the
    ports: ``vers=3,proto=tcp,nolock,port=2049,mountport=2049,mountproto=tcp``."""

    host: str
    path: str
    options: str = SEED_NFS_OPTIONS

    def mount(self, mountpoint: str) -> str:
        """The guest's shell command that mounts the export at ``mountpoint``."""
        return f"mount -t nfs -o {self.options} {self.host}:{self.path} {mountpoint}"


@dataclass(frozen=True)
class SmbShare:
    """An SMB share as the guest's cifs client mounts it."""

    host: str
    share: str
    username: str
    password: str
    options: str = "vers=3.1.1"

    def mount(self, mountpoint: str) -> str:
        options = f"{self.options},username={self.username},password={self.password}"
        return f"mount -t cifs //{self.host}/{self.share} {mountpoint} -o {options}"


def _log(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except FileNotFoundError:
        return "(no log)"


def start_rpcbind(guest: Guest) -> subprocess.Popen[bytes]:
    """rpcbind in ``guest``'s namespace, listening once this returns: servers there
    register with it, and the guest's mounts find the ports through it."""
    require("rpcbind", hint="apt-get install -y rpcbind")
    # its state lives in /run/rpcbind (the namespace's private /run), owned by _rpc
    state = guest.path("/run/rpcbind")
    state.mkdir(exist_ok=True)
    if "_rpc" in {user.pw_name for user in pwd.getpwall()}:
        shutil.chown(state, "_rpc")
    rpcbind = guest.popen(["rpcbind", "-f"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    guest.wait_for_port(111, rpcbind)
    return rpcbind


class _Server:
    """A reference server's private directory and the processes it started in the guest's
    namespace; a context manager that stops them (last started first) and cleans up."""

    def __init__(self, guest: Guest, prefix: str) -> None:
        self.guest = guest
        self.dir = Path(tempfile.mkdtemp(prefix=prefix, dir=guest.workdir))
        self._procs: list[subprocess.Popen[bytes]] = []

    def _start(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(self.dir / log, "wb") as out:
            proc = self.guest.popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self._procs.append(proc)
        return proc

    def __enter__(self) -> Self:
        try:
            self._up()
        except BaseException:
            self._down()
            raise
        return self

    def _up(self) -> None:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._down()

    def _down(self) -> None:
        for proc in reversed(self._procs):
            self.guest.stop(proc)
        self._procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


class Ganesha(_Server):
    """nfs-ganesha exporting ``directory`` over NFSv3 (TCP) at ``pseudo``, with rpcbind,
    so the guest mounts it with exactly the seed's options."""

    def __init__(
        self,
        guest: Guest,
        directory: Path,
        *,
        pseudo: str = "/export",
        nfs_port: int = 2049,
        mount_port: int = 20048,
    ) -> None:
        require("ganesha.nfsd", hint="apt-get install -y nfs-ganesha nfs-ganesha-vfs")
        super().__init__(guest, "loomfs-ganesha-")
        self.directory = directory
        self.nfs_port = nfs_port
        self.mount_port = mount_port
        self.export = NfsExport(guest.host_ip, pseudo)

    def _up(self) -> None:
        self._procs.append(start_rpcbind(self.guest))
        conf = self.dir / "ganesha.conf"
        conf.write_text(f"""
NFS_CORE_PARAM {{
    NFS_Port = {self.nfs_port}; MNT_Port = {self.mount_port}; Bind_addr = {self.guest.host_ip};
    Protocols = 3; Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false;
    mount_path_pseudo = true;
}}
NFSV4 {{ Graceless = true; RecoveryRoot = {self.dir}/recovery; }}
NFS_KRB5 {{ Active_krb5 = false; }}
EXPORT {{
    Export_Id = 1; Path = {self.directory}; Pseudo = {self.export.path};
    Protocols = 3; Transports = TCP; Access_Type = RW; Squash = No_Root_Squash; SecType = sys;
    FSAL {{ Name = VFS; }}
}}
LOG {{ Default_Log_Level = EVENT; }}
""")
        ganesha = self._start(
            ["ganesha.nfsd", "-F", "-f", str(conf), "-L", str(self.dir / "ganesha.log"),
             "-p", str(self.dir / "ganesha.pid")],
            "ganesha.out",
        )  # fmt: skip
        try:
            self.guest.wait_for_port(self.nfs_port, ganesha)
            self.guest.wait_for_port(self.mount_port, ganesha)
        except (RuntimeError, TimeoutError) as error:
            raise RuntimeError(f"{error}\n{self.log()}") from error

    def log(self) -> str:
        return _log(self.dir / "ganesha.log")


class Samba(_Server):
    """Plain smbd sharing ``directory`` as ``share`` to one user (root, with a password
    only its private passdb knows), SMB2 and up, no NetBIOS."""

    def __init__(self, guest: Guest, directory: Path, *, share: str = "share") -> None:
        require("smbd", "smbpasswd", hint="apt-get install -y samba")
        super().__init__(guest, "loomfs-samba-")
        self.directory = directory
        self.share = SmbShare(guest.host_ip, share, "root", secrets.token_hex(12))

    def _up(self) -> None:
        conf = self.dir / "smb.conf"
        state = {
            name: self.dir / name for name in ("private", "lock", "state", "cache", "pid", "rpc")
        }
        for path in state.values():
            path.mkdir()
        conf.write_text(f"""[global]
    server role = standalone server
    interfaces = {self.guest.host_ip}/24
    bind interfaces only = yes
    smb ports = 445
    disable netbios = yes
    server min protocol = SMB2_10
    passdb backend = tdbsam:{state["private"]}/passdb.tdb
    private dir = {state["private"]}
    lock directory = {state["lock"]}
    state directory = {state["state"]}
    cache directory = {state["cache"]}
    pid directory = {state["pid"]}
    ncalrpc dir = {state["rpc"]}
    log file = {self.dir}/smbd.log
    load printers = no
    printcap name = /dev/null
    disable spoolss = yes
[{self.share.share}]
    path = {self.directory}
    read only = no
    force user = root
""")
        password = f"{self.share.password}\n" * 2
        subprocess.run(
            ["smbpasswd", "-c", str(conf), "-s", "-a", self.share.username],
            input=password.encode(),
            capture_output=True,
            check=True,
        )
        # smbd's parent kill(0)s its process group on exit: popen gave it a session of
        # its own, and --no-process-group keeps it from making another we would not know
        smbd = self._start(["smbd", "-F", "--no-process-group", "-s", str(conf)], "smbd.out")
        try:
            self.guest.wait_for_port(445, smbd)
        except (RuntimeError, TimeoutError) as error:
            raise RuntimeError(f"{error}\n{self.log()}") from error

    def log(self) -> str:
        return _log(self.dir / "smbd.out") + _log(self.dir / "smbd.log")
