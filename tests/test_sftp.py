"""The SFTP server with real clients (OpenSSH's sftp in batch mode, asyncssh) in front of a
``loomfs hub serve`` process that serves REST, S3 and SFTP on the same namespace.

Users see /data (a posix volume) as '/'; what SFTP does is checked on the volume's disk,
over S3 (boto3) and over the REST API.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import asyncssh
import pytest

from loomfs.core.registry import open_catalog
from loomfs.core.sites import SiteRegistry
from loomfs.core.types import SYSTEM
from loomfs.core.users import AccessKey, UserRegistry
from loomfs.errors import AlreadyExists, NotFound
from loomfs.fabric.identity import SiteIdentity
from loomfs.hub.namespace import HubNamespace
from loomfs.protocols.sftp.errors import to_sftp
from loomfs.rest.client import RestNamespace
from loomfs.testing.fixtures import tmpfs
from loomfs.testing.hubproc import HubProcess, SiteProcess, SpokeProcess, spoke_args
from loomfs.testing.s3gateway import gateway_client
from loomfs.testing.sftp import make_key, openssh_sftp, sftp_batch

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MANY = 300  # files in one directory: more than one READDIR page (asyncssh sends 128)


@dataclass
class Site:
    hub: HubProcess
    vol: Path
    tmp: Path
    keys: Path
    s3key: AccessKey

    @property
    def port(self) -> int:
        return int(self.hub.urls["sftp"].rpartition(":")[2])

    def sftp(self, commands: str, *, user: str = "alice", key: str = "alice") -> str:
        """Run a batch that must succeed; its output."""
        done = sftp_batch(self.port, user, self.keys / key, commands, cwd=self.tmp)
        assert done.returncode == 0, done.stderr + done.stdout
        return done.stdout

    def s3(self) -> S3Client:
        return gateway_client(self.hub.urls["s3"], self.s3key.access_key, self.s3key.secret)

    async def connect(
        self, user: str = "alice", key: str = "alice"
    ) -> asyncssh.SSHClientConnection:
        return await asyncssh.connect(
            "127.0.0.1",
            self.port,
            username=user,
            client_keys=[str(self.keys / key)],
            known_hosts=None,
            agent_path=None,
            password=None,
        )


async def _prepare(tmp: Path, vol: Path) -> AccessKey:
    catalog = open_catalog(f"sqlite://{tmp / 'site' / 'catalog.db'}")
    await catalog.open()
    try:
        await HubNamespace(catalog).add_volume("/data", f"posix://{vol}")
        users = UserRegistry(catalog)
        for name in ("alice", "bob"):
            await users.add_user(name)
            await users.add_ssh_key(name, (tmp / "keys" / f"{name}.pub").read_text())
        return await users.add_access_key("alice")
    finally:
        await catalog.close()


@contextlib.contextmanager
def _serving(tmp: Path, vol: Path) -> Iterator[Site]:
    """A hub with its data in ``tmp``/site serving ``vol`` as /data over SFTP and S3."""
    keys = tmp / "keys"
    keys.mkdir()
    for name in ("alice", "bob", "stranger"):
        make_key(keys / name)
    (tmp / "site").mkdir(exist_ok=True)
    s3key = asyncio.run(_prepare(tmp, vol))
    config = tmp / "loomfs.toml"
    config.write_text(
        '[site]\nname = "west"\n[hub]\nrescan_interval = 0\n'
        '[s3]\nlisten = "127.0.0.1:0"\n[s3.buckets]\ndata = "/data"\n'
        '[sftp]\nlisten = "127.0.0.1:0"\nroot = "/data"\n'
    )
    with HubProcess(tmp / "site", env={"LOOMFS_CONFIG": str(config)}) as hub:
        yield Site(hub, vol, tmp, keys, s3key)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    openssh_sftp()  # fails with how to install it
    tmp = tmp_path_factory.mktemp("sftp")
    vol = tmp / "vol"
    (vol / "many").mkdir(parents=True)
    for i in range(MANY):
        (vol / "many" / f"f{i:04d}").write_bytes(b"x" * i)
    with _serving(tmp, vol) as made:
        yield made


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path below ``root`` with its content (None for a directory)."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def test_host_key_is_made_private_on_first_start(site: Site) -> None:
    key = site.tmp / "site" / "identity" / "ssh_host_ed25519_key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert asyncssh.read_private_key(key).get_algorithm() == "ssh-ed25519"


def test_put_and_get_a_large_file_byte_identical(site: Site) -> None:
    data = os.urandom(12 << 20) + b"tail"
    (site.tmp / "big.bin").write_bytes(data)
    out = site.sftp("put big.bin big.bin\nls -l\nget big.bin back.bin\n")
    assert (site.vol / "big.bin").read_bytes() == data
    assert (site.tmp / "back.bin").read_bytes() == data
    listed = [line.split() for line in out.splitlines()]
    assert any(words[-1] == "big.bin" and str(len(data)) in words for words in listed)


def test_directories_rename_chmod_and_remove(site: Site) -> None:
    (site.tmp / "small.txt").write_bytes(b"hello\n")
    site.sftp(
        "mkdir work\nput small.txt work/a.txt\nrename work/a.txt work/b.txt\nchmod 640 work/b.txt\n"
        "ln -s b.txt work/link\n"
    )
    assert os.readlink(site.vol / "work" / "link") == "b.txt"
    assert not (site.vol / "work" / "a.txt").exists()
    assert (site.vol / "work" / "b.txt").read_bytes() == b"hello\n"
    assert stat.S_IMODE((site.vol / "work" / "b.txt").stat().st_mode) == 0o640
    listing = site.sftp("ls -l work\n")
    assert "-rw-r-----" in listing and "b.txt" in listing
    site.sftp("rm work/link\nrm work/b.txt\nrmdir work\n")
    assert not (site.vol / "work").exists()


def test_wrong_or_unknown_keys_are_refused_and_change_nothing(site: Site) -> None:
    (site.tmp / "evil.txt").write_bytes(b"evil")
    before = _tree(site.vol)
    for user, key in (("alice", "stranger"), ("alice", "bob"), ("mallory", "alice")):
        done = sftp_batch(site.port, user, site.keys / key, "put evil.txt evil.txt\n", cwd=site.tmp)
        assert done.returncode != 0
        assert "Permission denied" in done.stderr
    assert _tree(site.vol) == before


async def test_password_logins_are_not_offered(site: Site) -> None:
    with pytest.raises(asyncssh.PermissionDenied):
        await asyncssh.connect(
            "127.0.0.1", site.port, username="alice", password="alice", client_keys=None,
            known_hosts=None, agent_path=None,
        )  # fmt: skip


def test_paths_cannot_leave_the_users_root(site: Site) -> None:
    outside = site.tmp / "outside.txt"
    (site.tmp / "escape.txt").write_bytes(b"inside after all")
    out = site.sftp("put escape.txt ../../../../outside.txt\ncd ../../..\npwd\n")
    assert not outside.exists()
    assert (site.vol / "outside.txt").read_bytes() == b"inside after all"
    assert "Remote working directory: /\n" in out
    for command in ("get /../../../etc/hostname stolen\n", "get ../../etc/hostname stolen\n"):
        done = sftp_batch(site.port, "alice", site.keys / "alice", command, cwd=site.tmp)
        assert done.returncode != 0 and "not found" in done.stderr.lower()
        assert not (site.tmp / "stolen").exists()


async def test_symlinks_stay_inside(site: Site) -> None:
    async with await site.connect() as conn, conn.start_sftp_client() as sftp:
        async with sftp.open("/target.txt", "wb") as f:
            await f.write(b"target")
        await sftp.symlink("/target.txt", "/link-abs")
        await sftp.symlink("../../../../etc/hostname", "/link-out")
        assert await sftp.readlink("/link-abs") == "target.txt"
        assert os.readlink(site.vol / "link-abs") == "target.txt"
        async with sftp.open("/link-abs") as f:
            assert await f.read() == "target"
        assert (await sftp.stat("/link-abs")).size == 6
        assert (await sftp.lstat("/link-abs")).type == asyncssh.FILEXFER_TYPE_SYMLINK
        # '../../..' from '/' is '/': the link names /etc/hostname below the root, not above
        assert os.readlink(site.vol / "link-out") == "etc/hostname"
        with pytest.raises(asyncssh.SFTPNoSuchFile):
            await sftp.stat("/link-out")


def test_a_file_put_over_sftp_is_read_over_s3_and_rest_and_back(site: Site) -> None:
    data = os.urandom(3 << 20)
    (site.tmp / "cross.bin").write_bytes(data)
    site.sftp("put cross.bin cross.bin\n")
    s3 = site.s3()
    assert s3.get_object(Bucket="data", Key="cross.bin")["Body"].read() == data

    async def rest_read() -> bytes:
        rest = RestNamespace(site.hub.url)
        try:
            return await rest.read_bytes(SYSTEM, "/data/cross.bin")
        finally:
            await rest.close()

    assert asyncio.run(rest_read()) == data
    s3.put_object(Bucket="data", Key="from-s3/obj.bin", Body=data[::-1])
    site.sftp("get from-s3/obj.bin obj.bin\n")
    assert (site.tmp / "obj.bin").read_bytes() == data[::-1]


async def test_asyncssh_client_operations(site: Site) -> None:
    async with await site.connect() as conn, conn.start_sftp_client() as sftp:
        assert os.fsdecode(await sftp.realpath(".")) == "/"
        names = await sftp.listdir("/many")
        assert sorted(n for n in names if n not in (".", "..")) == [
            f"f{i:04d}" for i in range(MANY)
        ]
        assert (await sftp.stat("/many/f0123")).size == 123
        # random reads of a large file, and a read-modify-write in place
        data = os.urandom(9 << 20)
        async with sftp.open("/rw.bin", "wb") as f:
            await f.write(data)
        async with sftp.open("/rw.bin", "rb") as f:
            for offset in (8 << 20, 17, 4 << 20, (4 << 20) - 5):
                await f.seek(offset)
                got: object = await f.read(10)  # bytes: the file is open in binary mode
                assert got == data[offset : offset + 10]
        async with sftp.open("/rw.bin", "r+b") as f:
            await f.seek(1000)
            await f.write(b"PATCH")
        patched = data[:1000] + b"PATCH" + data[1005:]
        assert (site.vol / "rw.bin").read_bytes() == patched
        async with sftp.open("/rw.bin", "ab") as f:
            await f.write(b"END")
        await sftp.truncate("/rw.bin", 10)
        assert (site.vol / "rw.bin").read_bytes() == patched[:10]
        await sftp.utime("/rw.bin", (1_600_000_000, 1_600_000_000))
        assert (await sftp.stat("/rw.bin")).mtime == 1_600_000_000
        # writes out of order (a hole filled later, a rewrite of what was sent) still
        # commit exactly what the spool holds
        async with sftp.open("/holes.bin", "wb") as f:
            await f.seek(3 << 20)
            await f.write(b"B" * (1 << 20))
            await f.seek(0)
            await f.write(b"A" * (3 << 20))
        assert (site.vol / "holes.bin").read_bytes() == b"A" * (3 << 20) + b"B" * (1 << 20)
        async with sftp.open("/rewrite.bin", "wb") as f:
            await f.write(b"C" * (3 << 20))
            await f.seek(10)
            await f.write(b"D")
        assert (site.vol / "rewrite.bin").read_bytes() == b"C" * 10 + b"D" + b"C" * ((3 << 20) - 11)
        with pytest.raises(asyncssh.SFTPNoSuchFile):
            await sftp.open("/no/such/dir/file", "wb")
        # SFTPv3 rename keeps an existing target; posix-rename replaces it
        async with sftp.open("/other.txt", "wb") as f:
            await f.write(b"other")
        with pytest.raises(asyncssh.SFTPFailure):
            await sftp.rename("/other.txt", "/rw.bin")
        await sftp.posix_rename("/other.txt", "/rw.bin")
        assert (site.vol / "rw.bin").read_bytes() == b"other"
        # errors come back with their status, and change nothing
        with pytest.raises(asyncssh.SFTPNoSuchFile):
            await sftp.stat("/nope")
        with pytest.raises(asyncssh.SFTPFailure):
            await sftp.mkdir("/many")
        with pytest.raises(asyncssh.SFTPFailure):
            await sftp.rmdir("/many")
        with pytest.raises(asyncssh.SFTPFailure):
            await sftp.remove("/many")
        with pytest.raises(asyncssh.SFTPFailure):
            async with sftp.open("/rw.bin", "xb"):
                pass
        assert len(list((site.vol / "many").iterdir())) == MANY


async def test_what_clients_create_gets_the_umask_and_chmod_does_not(site: Site) -> None:
    async with await site.connect() as conn, conn.start_sftp_client() as sftp:
        await sftp.mkdir("/umask-d")  # no mode sent: 0777 implied
        await sftp.mkdir("/umask-d/sent", asyncssh.SFTPAttrs(permissions=0o777))
        async with sftp.open("/umask-d/f", "wb") as f:  # asyncssh sends no mode
            await f.write(b"x")
        async with sftp.open("/umask-d/g", "wb", asyncssh.SFTPAttrs(permissions=0o666)):
            pass
        await sftp.chmod("/umask-d/g", 0o777)
        got = {n: (await sftp.stat(f"/umask-d/{n}")).permissions for n in ("sent", "f", "g")}
        got[""] = (await sftp.stat("/umask-d")).permissions
    assert {name: mode & 0o7777 for name, mode in got.items() if mode is not None} == {
        "": 0o755, "sent": 0o755, "f": 0o644, "g": 0o777,
    }  # fmt: skip
    assert stat.S_IMODE((site.vol / "umask-d").stat().st_mode) == 0o755


async def test_sessions_are_their_users_and_errors_name_client_paths(site: Site) -> None:
    async with await site.connect("bob", "bob") as conn, conn.start_sftp_client() as sftp:
        assert "many" in await sftp.listdir("/")
        with pytest.raises(asyncssh.SFTPFailure) as refused:
            await sftp.remove("/many")
    # the message names the path as bob sees it, not where his root lies in the namespace
    assert "/many" in refused.value.reason and "/data" not in refused.value.reason
    log = (site.tmp / "site" / "service.log").read_text()
    assert '"msg": "sftp session", "user": "bob", "root": "/data"' in log


async def test_an_upload_cut_short_is_not_committed(site: Site) -> None:
    log = site.tmp / "site" / "service.log"
    conn = await site.connect()
    sftp = await conn.start_sftp_client()
    f = await sftp.open("/cut.bin", "wb")
    await f.write(os.urandom(5 << 20))
    conn.abort()  # gone without closing the file
    # the hub is another process: its log is what says it has dealt with the lost session
    while "sftp upload abandoned" not in log.read_text():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    assert not (site.vol / "cut.bin").exists()
    assert [p.name for p in site.vol.iterdir() if p.name.startswith(".")] == []
    async with await site.connect() as again, again.start_sftp_client() as check:
        assert not await check.exists("/cut.bin")


async def _upload_into_a_full_spool(site: Site, name: str) -> None:
    """Write 30 MB until the hub refuses, then close the file as a client that goes on
    would: the close must not commit what the spool took."""
    async with await site.connect() as conn, conn.start_sftp_client() as sftp:
        f = await sftp.open(f"/{name}", "wb")
        with pytest.raises(asyncssh.SFTPError) as failed:
            for _ in range(30):
                await f.write(os.urandom(1 << 20))
        # SFTP 3 has no "no space" status (asyncssh sends FX_FAILURE): the message says it
        assert f"spool {site.tmp / 'site' / 'sftp-spool'} is full" in failed.value.reason
        with contextlib.suppress(asyncssh.SFTPError):
            await f.close()


def test_an_upload_the_spool_has_no_room_for_leaves_the_volume_as_it_was(
    tmp_path: Path,
) -> None:
    """The hub's SFTP spool (in its data directory) fills up in the middle of a 30 MB
    upload: the write fails with "no space", and no piece of it reaches the volume, over an
    existing file or as a new one, with OpenSSH's put or a client that closes the file
    after the error; once the spool is released, uploads work again."""
    openssh_sftp()
    vol = tmp_path / "vol"
    vol.mkdir()
    old = os.urandom(1 << 20)
    (vol / "kept.bin").write_bytes(old)
    (tmp_path / "big.bin").write_bytes(os.urandom(30 << 20))
    (tmp_path / "small.bin").write_bytes(b"room again")
    with tmpfs(tmp_path / "site", "12m"), _serving(tmp_path, vol) as site:
        for name in ("kept.bin", "new.bin"):
            done = sftp_batch(
                site.port, "alice", site.keys / "alice", f"put big.bin {name}\n", cwd=tmp_path
            )
            assert done.returncode != 0, name
            asyncio.run(_upload_into_a_full_spool(site, name))
        assert (vol / "kept.bin").read_bytes() == old
        assert sorted(os.listdir(vol)) == ["kept.bin"]  # no piece, no temp file
        site.sftp("put small.bin kept.bin\n")
        assert (vol / "kept.bin").read_bytes() == b"room again"


async def _prepare_hub_and_spoke(hub_dir: Path, spoke_dir: Path, data: Path, key: str) -> None:
    hub_catalog = open_catalog(f"sqlite://{hub_dir / 'catalog.db'}")
    await hub_catalog.open()
    try:
        await HubNamespace(hub_catalog).add_volume("/datasets/d", f"posix://{data}")
        spoke_cert = (spoke_dir / "identity" / "site.pem").read_bytes()
        await SiteRegistry(hub_catalog).add(spoke_cert)
    finally:
        await hub_catalog.close()
    # a spoke's logins are its own: its users live in its own site catalog
    spoke_catalog = open_catalog(f"sqlite://{spoke_dir / 'catalog.db'}")
    await spoke_catalog.open()
    try:
        users = UserRegistry(spoke_catalog)
        await users.add_user("carol")
        await users.add_ssh_key("carol", key)
    finally:
        await spoke_catalog.close()


def test_a_spoke_serves_its_namespace_over_sftp(tmp_path: Path) -> None:
    hub_dir, spoke_dir, data = tmp_path / "hub", tmp_path / "spoke", tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_bytes(b"from the hub\n" * 1000)
    SiteIdentity.create(hub_dir / "identity", "hub-eu")
    SiteIdentity.create(spoke_dir / "identity", "gpu-west")
    key = make_key(tmp_path / "carol")
    asyncio.run(_prepare_hub_and_spoke(hub_dir, spoke_dir, data, key))
    (tmp_path / "out.txt").write_bytes(b"written at the spoke")
    with HubProcess(hub_dir, {"LOOMFS_FABRIC__LISTEN": "127.0.0.1:0"}) as hub:
        env = {"LOOMFS_SFTP__LISTEN": "127.0.0.1:0"}
        args = spoke_args(hub_dir, hub.urls["fabric"], "/datasets/d")
        with SpokeProcess(spoke_dir, env, args=args) as spoke:
            port = int(spoke.urls["sftp"].rpartition(":")[2])
            commands = "get /datasets/d/in.txt in.txt\nput out.txt /datasets/d/out.txt\n"
            done = sftp_batch(port, "carol", tmp_path / "carol", commands, cwd=tmp_path)
            assert done.returncode == 0, done.stderr
    assert (tmp_path / "in.txt").read_bytes() == (data / "in.txt").read_bytes()
    # without write-back a spoke's write is the hub's before it is acknowledged
    assert (data / "out.txt").read_bytes() == b"written at the spoke"


class ServeSftp(SiteProcess):
    command = ("serve", "sftp")  # its --listen is the SFTP address


async def test_serve_sftp_command(tmp_path: Path) -> None:
    make_key(tmp_path / "nobody")
    env = {"LOOMFS_HUB__LISTEN": "127.0.0.1:0"}
    with ServeSftp(tmp_path / "site", env) as served:
        assert served.urls["sftp"].startswith("sftp://127.0.0.1:")
        port = int(served.urls["sftp"].rpartition(":")[2])
        with pytest.raises(asyncssh.PermissionDenied):
            await asyncssh.connect(
                "127.0.0.1", port, username="nobody", client_keys=[str(tmp_path / "nobody")],
                known_hosts=None, agent_path=None,
            )  # fmt: skip
    assert (tmp_path / "site" / "identity" / "ssh_host_ed25519_key.pub").exists()


def test_error_messages_name_paths_below_the_users_root() -> None:
    exc = AlreadyExists("cannot move /data/data/x to /data: already exists; /database is not")
    error = to_sftp(exc, "/data")
    assert error.code == asyncssh.FX_FILE_ALREADY_EXISTS
    assert error.reason == "cannot move /data/x to /: already exists; /database is not"
    assert to_sftp(NotFound("gone: /home/al/x"), "/home/al").reason == "gone: /x"
