"""OpenSSH's ``sftp`` client in batch mode, for tests, the demo and benchmarks (testing layer)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import asyncssh

SFTP_SERVER = Path("/usr/lib/openssh/sftp-server")  # Debian's openssh-sftp-server


def openssh_sftp() -> str:
    """The path of OpenSSH's ``sftp``, or an error that says how to install it."""
    found = shutil.which("sftp")
    if found is None:
        raise RuntimeError("OpenSSH's sftp is missing: apt-get install openssh-client")
    return found


def make_key(path: Path, comment: str = "") -> str:
    """A new ed25519 key pair at ``path`` (private, 0600) and ``path``.pub; the public line."""
    key = asyncssh.generate_private_key("ssh-ed25519", comment=comment or path.name)
    key.write_private_key(path)
    path.chmod(0o600)  # ssh refuses a private key that others can read
    key.write_public_key(path.with_name(path.name + ".pub"))
    return key.export_public_key().decode().strip()


def ssh_options(port: int, key: Path) -> list[str]:
    """Options for a non-interactive login with exactly ``key`` to a server on loopback
    whose host key is new each run (so it is neither checked nor remembered)."""
    return [
        "-P", str(port), "-i", str(key),
        "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR", "-o", "PasswordAuthentication=no",
    ]  # fmt: skip


def sftp_batch(
    port: int,
    user: str,
    key: Path,
    commands: str,
    *,
    cwd: Path,
    extra: tuple[str, ...] = (),
    timeout: float = 300.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``commands`` (one per line, as in an ``sftp -b`` file) against
    ``user@127.0.0.1:port``; the batch stops at the first failing command."""
    return subprocess.run(
        [openssh_sftp(), "-b", "-", *ssh_options(port, key), *extra, f"{user}@127.0.0.1"],
        input=commands,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
