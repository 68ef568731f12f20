"""Large-file SFTP transfers: loomfs's SFTP server next to OpenSSH's sftp-server.

Bench layer, issue 7. The same client (OpenSSH's ``sftp`` in batch mode, which keeps 64
requests of 32 KiB in flight) puts and gets the same file through:

- loomfs: ``loomfs hub serve`` with ``[sftp] listen``, the file in a posix volume; a put
  is spooled and committed with one namespace write on close, a get is served from
  version-pinned windows with readahead.
- openssh: ``sshd`` on a free loopback port (temporary config and host key) with its own
  ``sftp-server``, writing to a plain directory: the peer, same cipher and MAC.
- pipe: ``sftp -D sftp-server``, SFTP over a pipe with no SSH at all (no encryption, no
  network): what the client and the disk allow, for scale.

Every transfer is checked byte for byte. Each figure is the best of ``--rounds`` runs, in
MB/s (10^6 bytes per second), and the ratio loomfs/openssh is printed.

Run: ``PYTHONPATH=src python bench/sftp.py [--quick] [--size-mib 512] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import filecmp
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from loomfs.core.registry import open_catalog
from loomfs.core.users import UserRegistry
from loomfs.hub.namespace import HubNamespace
from loomfs.testing.hubproc import HubProcess
from loomfs.testing.ports import free_port, stop_process, wait_for_port
from loomfs.testing.sftp import SFTP_SERVER, make_key, openssh_sftp, sftp_batch

USER = "bench"
# both servers speak it, and AES-GCM is what OpenSSL accelerates on either side
CIPHER = "aes128-gcm@openssh.com"
Batch = Callable[[str], None]


def _check(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"sftp failed: {done.stderr.strip() or done.stdout.strip()}")


async def _prepare_site(data_dir: Path, volume: Path, public_key: str) -> None:
    catalog = open_catalog(f"sqlite://{data_dir / 'catalog.db'}")
    await catalog.open()
    try:
        await HubNamespace(catalog).add_volume("/bench", f"posix://{volume}")
        users = UserRegistry(catalog)
        await users.add_user(USER)
        await users.add_ssh_key(USER, public_key)
    finally:
        await catalog.close()


@contextmanager
def loomfs_peer(tmp: Path, key: Path) -> Iterator[tuple[Batch, Path]]:
    volume, data_dir = tmp / "loomfs-volume", tmp / "loomfs-site"
    volume.mkdir()
    data_dir.mkdir()
    public = key.with_name(key.name + ".pub").read_text()
    asyncio.run(_prepare_site(data_dir, volume, public))
    config = tmp / "loomfs.toml"
    config.write_text(
        '[hub]\nrescan_interval = 0\nwatch = false\n[log]\nlevel = "WARNING"\n'
        '[sftp]\nlisten = "127.0.0.1:0"\nroot = "/bench"\n'
    )
    with HubProcess(data_dir, env={"LOOMFS_CONFIG": str(config)}) as hub:
        port = int(hub.urls["sftp"].rpartition(":")[2])

        def batch(commands: str) -> None:
            _check(sftp_batch(port, USER, key, commands, cwd=tmp, extra=("-c", CIPHER)))

        yield batch, volume


@contextmanager
def openssh_peer(tmp: Path, key: Path) -> Iterator[tuple[Batch, Path]]:
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not SFTP_SERVER.exists() or not os.path.exists(sshd):
        raise RuntimeError("the peer needs apt-get install openssh-server openssh-sftp-server")
    root = tmp / "openssh"
    target = root / "files"
    target.mkdir(parents=True)
    host_key = root / "host_key"
    make_key(host_key)
    authorized = root / "authorized_keys"
    shutil.copy(key.with_name(key.name + ".pub"), authorized)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    port = free_port()
    config = root / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {authorized}\nPidFile none\nUsePAM no\nStrictModes no\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin yes\n"
        f"Subsystem sftp {SFTP_SERVER}\n"
    )
    proc = subprocess.Popen(
        [sshd, "-D", "-e", "-f", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for_port(port, proc=proc)
        user = os.environ.get("USER") or "root"

        def batch(commands: str) -> None:
            # the files live in `target`: absolute remote paths, since the login starts in ~
            _check(sftp_batch(port, user, key, commands, cwd=tmp, extra=("-c", CIPHER)))

        yield batch, target
    finally:
        stop_process(proc)


@contextmanager
def pipe_peer(tmp: Path, key: Path) -> Iterator[tuple[Batch, Path]]:
    target = tmp / "pipe"
    target.mkdir()

    def batch(commands: str) -> None:
        done = subprocess.run(
            [openssh_sftp(), "-b", "-", "-D", str(SFTP_SERVER)],
            input=commands, cwd=tmp, capture_output=True, text=True, check=False,
        )  # fmt: skip
        _check(done)

    yield batch, target


PEERS = {"loomfs": loomfs_peer, "openssh": openssh_peer, "pipe": pipe_peer}


def measure(name: str, tmp: Path, key: Path, source: Path, rounds: int) -> dict[str, float]:
    size = source.stat().st_size
    best = {"put": 0.0, "get": 0.0}
    with PEERS[name](tmp, key) as (batch, where):
        # loomfs users see their root as '/'; the others name the directory on disk
        remote = "/big.bin" if name == "loomfs" else str(where / "big.bin")
        back = tmp / f"back-{name}.bin"
        for _ in range(rounds):
            for op, commands in (
                ("put", f"put {source} {remote}\n"),
                ("get", f"get {remote} {back}\n"),
            ):
                start = time.perf_counter()
                batch(commands)
                rate = size / (time.perf_counter() - start) / 1e6
                best[op] = max(best[op], rate)
            if not filecmp.cmp(source, where / "big.bin", shallow=False):
                raise RuntimeError(f"{name}: the file put differs from the source")
            if not filecmp.cmp(source, back, shallow=False):
                raise RuntimeError(f"{name}: the file got differs from the source")
            back.unlink()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB, one round")
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    size_mib, rounds = (64, 1) if args.quick else (args.size_mib, args.rounds)
    openssh_sftp()
    with tempfile.TemporaryDirectory(prefix="loomfs-bench-sftp-") as scratch:
        tmp = Path(scratch)
        key = tmp / "client_key"
        make_key(key)
        source = tmp / "source.bin"
        with source.open("wb") as out:
            for _ in range(size_mib):
                out.write(os.urandom(1 << 20))
        results = {name: measure(name, tmp, key, source, rounds) for name in PEERS}
    print(f"{size_mib} MiB file, best of {rounds}, cipher {CIPHER}, {os.cpu_count()} CPUs")
    print(f"{'server':10} {'put MB/s':>10} {'get MB/s':>10}")
    for name, rates in results.items():
        print(f"{name:10} {rates['put']:10.1f} {rates['get']:10.1f}")
    for op in ("put", "get"):
        ratio = results["loomfs"][op] / results["openssh"][op]
        print(f"loomfs/openssh {op}: {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"size_mib": size_mib, "rounds": rounds, **results}))


if __name__ == "__main__":
    main()
