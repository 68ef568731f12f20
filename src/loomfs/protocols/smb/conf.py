"""What Samba reads, written from loomfs's records (protocol layer): smb.conf, the
smbpasswd file and the nss_wrapper account files.

Pure functions of their inputs, so they are tested without Samba. Samba needs a Unix
account for each user it logs in: nss_wrapper (preloaded into smbd only) answers its
account lookups from files loomfs writes, so nothing touches the machine's /etc/passwd.
Every SMB user has one primary group, ``GROUP``: the mount's directory lets that group
through and no one else (see ``server``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ...core.users import SMB_UID_BASE, SmbLogin
from ...errors import ConfigError

GROUP = "loomfs-smb"
GID = SMB_UID_BASE - 1
#: the accounts Samba itself needs (root; the guest account, which no one logs in as)
_SYSTEM_ACCOUNTS = {"root": (0, 0), "nobody": (65534, 65534)}


@dataclass(frozen=True, slots=True)
class Share:
    name: str
    #: the share's directory in the mount
    path: Path
    read_only: bool


def users_of(logins: Iterable[SmbLogin]) -> list[SmbLogin]:
    """The logins Samba gets: a user named as one of its own accounts is left out (she
    would be root to the machine)."""
    return [login for login in logins if login.user not in _SYSTEM_ACCOUNTS]


def passwd_file(logins: Iterable[SmbLogin]) -> str:
    lines = [f"{name}:x:{uid}:{gid}:{name}:/nonexistent:/bin/false"
             for name, (uid, gid) in _SYSTEM_ACCOUNTS.items()]  # fmt: skip
    lines += [
        f"{login.user}:x:{login.uid}:{GID}:{login.user}:/nonexistent:/bin/false"
        for login in users_of(logins)
    ]
    return "\n".join(lines) + "\n"


def group_file(logins: Iterable[SmbLogin]) -> str:
    members = ",".join(login.user for login in users_of(logins))
    return f"root:x:0:\nnogroup:x:65534:\n{GROUP}:x:{GID}:{members}\n"


def smbpasswd_file(logins: Iterable[SmbLogin]) -> str:
    """Samba's smbpasswd passdb: the NT hash, no LanMan hash (X's), flags U (a user) and
    X (the password does not expire), and when it was set (a time of 0 would make Samba
    ask for a new one at the first logon)."""
    lines = []
    for login in users_of(logins):
        changed = login.changed_ns // 1_000_000_000 or int(time.time())
        hashes = f"{'X' * 32}:{login.nt_hash}"
        lines.append(f"{login.user}:{login.uid}:{hashes}:[UX         ]:LCT-{changed:08X}:")
    return "".join(line + "\n" for line in lines)


def smb_conf(
    *,
    host: str,
    port: int,
    state: Path,
    passdb: Path,
    shares: Iterable[Share],
    extended_attributes: bool = True,
    rpc_on_demand: bool = True,
) -> str:
    """smb.conf of a standalone server on ``host``:``port`` with its state under ``state``:
    SMB2 and later only, signing required, no NetBIOS, no printing, no guests; names are
    case-sensitive and DOS attributes are not kept (they would be xattrs, i.e. tags).
    ``rpc_on_demand``: smbd starts samba-dcerpcd when a client first asks for an RPC
    (else its starter runs it)."""
    wildcard = host in ("0.0.0.0", "::", "")
    settings: dict[str, str] = {
        "server role": "standalone server",
        "workgroup": "LOOMFS",
        "disable netbios": "yes",
        "smb ports": str(port),
        "bind interfaces only": "no" if wildcard else "yes",
        "server min protocol": "SMB2_10",
        "server signing": "mandatory",
        "load printers": "no",
        "printing": "bsd",
        "printcap name": "/dev/null",
        "disable spoolss": "yes",
        "passdb backend": f"smbpasswd:{passdb}",
        "map to guest": "never",
        "restrict anonymous": "2",
        "guest account": "nobody",
        "unix password sync": "no",
        "obey pam restrictions": "no",
        "usershare max shares": "0",
        "host msdfs": "no",
        # loomfs keeps no byte-range locks or share modes of its own: Samba's are the ones
        "kernel oplocks": "no",
        "kernel share modes": "no",
        "posix locking": "no",
        "store dos attributes": "no",
        "map archive": "no",
        "map hidden": "no",
        "map system": "no",
        "ea support": "yes" if extended_attributes else "no",
        "case sensitive": "yes",
        "preserve case": "yes",
        "short preserve case": "yes",
        "mangled names": "no",
        "wide links": "no",
        "rpc start on demand helpers": "yes" if rpc_on_demand else "no",
    }
    if not wildcard:
        settings["interfaces"] = host
    for what in ("lock", "state", "cache", "pid"):
        settings[f"{what} directory"] = str(state / what)
    settings["private dir"] = str(state / "private")
    settings["ncalrpc dir"] = str(state / "ncalrpc")
    out = ["[global]", *_lines(settings)]
    for share in shares:
        out += [
            f"[{share.name}]",
            *_lines(
                {
                    "path": str(share.path),
                    "read only": "yes" if share.read_only else "no",
                    "guest ok": "no",
                    "browseable": "yes",
                }
            ),
        ]
    return "\n".join(out) + "\n"


def _lines(settings: Mapping[str, str]) -> list[str]:
    for key, value in settings.items():
        if "\n" in value or "\r" in value:
            raise ConfigError(f"smb.conf: {key} may not span lines: {value!r}")
    return [f"   {key} = {value}" for key, value in settings.items()]


STATE_DIRS = ("lock", "state", "cache", "pid", "ncalrpc", "private", "log")
