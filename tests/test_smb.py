"""SMB through Samba with real clients (Samba's smbclient, the smbprotocol library) in front
of a ``loomfs hub serve`` process that serves REST, S3 and SMB on the same namespace.

Shares: ``data`` is /data (a posix volume), ``frozen`` the same directory read-only. What
SMB does is checked on the volume's disk, over S3 (boto3), over REST and in the audit
log; what the other protocols do is read back over SMB. The files Samba reads (smb.conf,
smbpasswd, nss_wrapper's accounts) and the NT hash are checked without Samba too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest
import smbclient
from hypothesis import given, settings
from hypothesis import strategies as st
from smbprotocol.exceptions import SMBOSError
from smbprotocol.header import NtStatus

from loomfs.core.acl import AclStore
from loomfs.core.audit import AuditReader
from loomfs.core.exports import check_share_name
from loomfs.core.nthash import md4, nt_hash
from loomfs.core.placement import Policy, PolicyStore
from loomfs.core.registry import open_catalog
from loomfs.core.sites import SiteRegistry
from loomfs.core.types import SYSTEM
from loomfs.core.users import SMB_UID_BASE, AccessKey, SmbLogin, UserRegistry
from loomfs.errors import ConfigError
from loomfs.fabric.identity import SiteIdentity
from loomfs.hub.namespace import HubNamespace
from loomfs.protocols.smb import conf
from loomfs.protocols.smb.server import kill_all, mount_dir, running_with
from loomfs.rest.client import RestNamespace
from loomfs.testing.hubproc import HubProcess, SpokeProcess, cli_ok, run_cli, spoke_args
from loomfs.testing.s3gateway import gateway_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

T = TypeVar("T")
PASSWORDS = {"alice": "alice-Secret-1", "bob": "bob-Secret-2"}
#: how long a change made elsewhere may take to show (the registry is read every 2 s,
#: smbd comes back after a second): a bound for the loops that wait, not a timing claim
SETTLE_S = 60.0


# -- what Samba reads, without Samba ---------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "digest"),
    [  # RFC 1320's test suite
        (b"", "31d6cfe0d16ae931b73c59d7e0c089c0"),
        (b"a", "bde52cb31de33e46245e05fbdbd6fb24"),
        (b"abc", "a448017aaf21d8525fc10ae87aa6729d"),
        (b"message digest", "d9130a8164549fe818874806e1c7014b"),
        (b"abcdefghijklmnopqrstuvwxyz", "d79e1c308aa5bbcdeea8ed63df412da9"),
        (
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
            "043f8582f241db351ce627e153e7f0e4",
        ),
        (b"1234567890" * 8, "e33b4ddc9c38f2199c3e7b164fcc0536"),
    ],
)
def test_md4_matches_rfc_1320(data: bytes, digest: str) -> None:
    assert md4(data).hex() == digest


def test_nt_hash_is_md4_of_utf16le() -> None:
    assert nt_hash("password") == "8846F7EAEE8FB117AD06BDD830B7586C"  # the well-known one
    assert nt_hash("pässwörd€") == md4("pässwörd€".encode("utf-16-le")).hex().upper()


_names = st.from_regex(r"[a-z][a-z0-9._-]{0,15}", fullmatch=True)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(_names, st.text(min_size=1, max_size=20), max_size=6))
def test_account_files_name_each_login_once(passwords: dict[str, str]) -> None:
    logins = [
        SmbLogin(name, SMB_UID_BASE + i, nt_hash(pw), 1_700_000_000_000_000_000)
        for i, (name, pw) in enumerate(sorted(passwords.items()))
    ]
    kept = {login.user: login for login in logins if login.user not in ("root", "nobody")}
    passwd = [line.split(":") for line in conf.passwd_file(logins).splitlines()]
    smbpasswd = [line.split(":") for line in conf.smbpasswd_file(logins).splitlines()]
    group = dict(line.split(":", 3)[::3] for line in conf.group_file(logins).splitlines())
    # root and the guest account once each, every other login once, at her uid
    assert [p[0] for p in passwd] == ["root", "nobody", *kept]
    assert {p[0]: int(p[2]) for p in passwd[2:]} == {n: u.uid for n, u in kept.items()}
    assert all(int(p[3]) == conf.GID for p in passwd[2:])
    assert set(filter(None, group[conf.GROUP].split(","))) == set(kept)
    # smbpasswd: name, uid, no LanMan hash, the NT hash, a user whose password never expires
    assert [(s[0], int(s[1]), s[2], s[3]) for s in smbpasswd] == [
        (n, u.uid, "X" * 32, u.nt_hash) for n, u in kept.items()
    ]
    assert all(s[4] == "[UX         ]" and s[5] == "LCT-6553F100" for s in smbpasswd)


def test_smb_conf_says_what_the_issue_asks(tmp_path: Path) -> None:
    shares = [conf.Share("data", tmp_path / "mnt" / "data", False),
              conf.Share("frozen", tmp_path / "mnt" / "data", True)]  # fmt: skip
    text = conf.smb_conf(
        host="127.0.0.1", port=4450, state=tmp_path, passdb=tmp_path / "p", shares=shares
    )
    settings_of: dict[str, dict[str, str]] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
            settings_of[section] = {}
        else:
            key, _, value = line.strip().partition(" = ")
            settings_of[section][key] = value
    g = settings_of["global"]
    assert (g["smb ports"], g["interfaces"], g["bind interfaces only"]) == (
        "4450",
        "127.0.0.1",
        "yes",
    )
    assert g["server min protocol"] == "SMB2_10" and g["server signing"] == "mandatory"
    assert g["disable netbios"] == "yes" and g["load printers"] == "no"
    assert g["case sensitive"] == "yes" and g["map to guest"] == "never"
    assert all(Path(g[f"{d} directory"]).parent == tmp_path for d in ("lock", "state", "pid"))
    assert g["ea support"] == "yes"
    without = conf.smb_conf(host="127.0.0.1", port=1, state=tmp_path, passdb=tmp_path / "p",
                            shares=shares, extended_attributes=False)  # fmt: skip
    assert "   ea support = no\n" in without
    assert settings_of["data"]["read only"] == "no"
    assert settings_of["frozen"]["read only"] == "yes"
    with pytest.raises(ConfigError):
        conf.smb_conf(host="h", port=1, state=tmp_path, passdb=tmp_path / "p",
                      shares=[conf.Share("x", Path("/a\n[evil]"), False)])  # fmt: skip
    with pytest.raises(ConfigError):
        check_share_name("homes")


@settings(max_examples=10, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["set", "remove"]), st.sampled_from("abcd")), max_size=12)
)
def test_smb_uids_are_unique_and_kept(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str]]
) -> None:
    """Whatever users are given passwords, given new ones or removed: one uid each, in the
    SMB range, never shared, kept across a new password."""

    async def run() -> None:
        catalog = open_catalog(f"sqlite://{tmp_path_factory.mktemp('uids') / 'c.db'}")
        await catalog.open()
        try:
            users, uids = UserRegistry(catalog), dict[str, int]()
            for op, name in ops:
                if op == "set":
                    with contextlib.suppress(Exception):
                        await users.add_user(name)
                    login = await users.set_smb_password(name, nt_hash(uuid.uuid4().hex))
                    assert uids.setdefault(name, login.uid) == login.uid
                elif name in uids:
                    await users.remove_user(name)
                    del uids[name]
                logins = await users.smb_logins()
                assert {x.user: x.uid for x in logins} == uids
                assert len(set(uids.values())) == len(uids)
                assert all(uid >= SMB_UID_BASE for uid in uids.values())
        finally:
            await catalog.close()

    asyncio.run(run())


# -- a hub serving SMB ----------------------------------------------------------------------------


@dataclass
class Site:
    hub: HubProcess
    vol: Path
    tmp: Path
    s3key: AccessKey

    @property
    def port(self) -> int:
        return int(self.hub.urls["smb"].rpartition(":")[2])

    def smbclient(
        self, commands: str, *, user: str = "alice", password: str | None = None,
        share: str = "data",
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        secret = PASSWORDS[user] if password is None else password
        return subprocess.run(
            ["smbclient", f"//127.0.0.1/{share}", "-p", str(self.port), "-m", "SMB3",
             "-U", f"{user}%{secret}", "-c", commands],
            capture_output=True, text=True, cwd=self.tmp, timeout=120, check=False,
        )  # fmt: skip

    def ok(self, commands: str, **kwargs: str) -> str:
        done = self.smbclient(commands, **kwargs)
        assert done.returncode == 0 and "NT_STATUS" not in done.stdout, done.stdout + done.stderr
        return done.stdout

    def unc(self, name: str, share: str = "data") -> str:
        return rf"\\127.0.0.1\{share}\{name}"

    def session(self, user: str) -> dict[str, object]:
        """smbprotocol's keyword arguments that log ``user`` in."""
        return {"username": user, "password": PASSWORDS[user], "port": self.port}

    def s3(self) -> S3Client:
        return gateway_client(self.hub.urls["s3"], self.s3key.access_key, self.s3key.secret)


async def _prepare(tmp: Path, vol: Path) -> AccessKey:
    catalog = open_catalog(f"sqlite://{tmp / 'site' / 'catalog.db'}")
    await catalog.open()
    try:
        await HubNamespace(catalog).add_volume("/data", f"posix://{vol}")
        users = UserRegistry(catalog)
        for name in PASSWORDS:
            await users.add_user(name)
        acl = AclStore(catalog)
        await acl.set_private("/data/private", True)  # alice's alone
        await acl.grant("user:alice", "write", "/data/private")
        return await users.add_access_key("alice")
    finally:
        await catalog.close()


@contextlib.contextmanager
def _serving(tmp: Path, vol: Path) -> Iterator[Site]:
    (tmp / "site").mkdir(exist_ok=True)
    s3key = asyncio.run(_prepare(tmp, vol))
    for name, password in PASSWORDS.items():  # as a user would type it
        cli_ok(tmp / "site", "user", "passwd", name, "--stdin", "--offline",
               stdin=f"{password}\n".encode())  # fmt: skip
    config = tmp / "loomfs.toml"
    config.write_text(
        '[site]\nname = "west"\n[hub]\nrescan_interval = 0\n'
        '[s3]\nlisten = "127.0.0.1:0"\n[s3.buckets]\ndata = "/data"\n'
        '[smb]\nlisten = "127.0.0.1:0"\n'
        '[smb.shares]\ndata = { path = "/data" }\nfrozen = { path = "/data", access = "ro" }\n'
        'private = { path = "/data/private" }\n'
    )
    with HubProcess(tmp / "site", env={"LOOMFS_CONFIG": str(config)}) as hub:
        yield Site(hub, vol, tmp, s3key)
    smbclient.reset_connection_cache()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    for tool in ("smbclient", "smbd"):
        assert subprocess.run(["which", tool], capture_output=True, check=False).returncode == 0, (
            f"{tool} is missing: apt-get install samba smbclient"
        )
    tmp = tmp_path_factory.mktemp("smb")
    vol = tmp / "vol"
    (vol / "private").mkdir(parents=True)
    (vol / "private" / "plans.txt").write_bytes(b"alice's plans")
    with _serving(tmp, vol) as made:
        yield made


def _eventually(probe: Callable[[], T]) -> T:
    """``probe``'s result once it stops raising (a change elsewhere takes a moment)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        try:
            return probe()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_put_get_ls_rename_delete(site: Site) -> None:
    source = site.tmp / "hello.txt"
    source.write_bytes(b"hello over SMB\n")
    site.ok("mkdir d; put hello.txt d\\hello.txt; rename d\\hello.txt d\\renamed.txt")
    assert (site.vol / "d" / "renamed.txt").read_bytes() == b"hello over SMB\n"
    assert not (site.vol / "d" / "hello.txt").exists()
    listing = site.ok("ls d\\*")
    assert re.search(r"renamed\.txt\s+\S*\s+15\s", listing), listing
    site.ok("get d\\renamed.txt back.txt")
    assert (site.tmp / "back.txt").read_bytes() == b"hello over SMB\n"
    site.ok("del d\\renamed.txt; rmdir d")
    assert not (site.vol / "d").exists()


def test_files_made_over_smb_are_hers_on_disk(site: Site) -> None:
    site.ok("mkdir mine")
    accounts = (site.tmp / "site" / "smb" / "accounts" / "passwd").read_text().splitlines()
    uid = {line.split(":")[0]: int(line.split(":")[2]) for line in accounts}
    assert (site.vol / "mine").stat().st_uid == uid["alice"] >= SMB_UID_BASE


def test_a_wrong_password_is_refused(site: Site) -> None:
    done = site.smbclient("ls", password="not-her-password")
    assert "NT_STATUS_LOGON_FAILURE" in done.stdout + done.stderr
    done = site.smbclient("ls", user="alice", password=PASSWORDS["bob"])
    assert "NT_STATUS_LOGON_FAILURE" in done.stdout + done.stderr
    with pytest.raises(SMBOSError) as refused:
        smbclient.listdir(site.unc(""), username="alice", password="nope", port=site.port)
    assert refused.value.ntstatus == NtStatus.STATUS_LOGON_FAILURE


def test_a_user_denied_by_an_acl_gets_access_denied_and_no_bytes(site: Site) -> None:
    site.ok("get private\\plans.txt plans-alice.txt")
    assert (site.tmp / "plans-alice.txt").read_bytes() == b"alice's plans"
    done = site.smbclient("get private\\plans.txt plans-bob.txt", user="bob")
    assert "NT_STATUS_ACCESS_DENIED" in done.stdout + done.stderr
    got = site.tmp / "plans-bob.txt"
    assert not got.exists() or got.read_bytes() == b""
    for name, mode in (("plans.txt", "rb"), ("bob.txt", "wb")):
        unc = site.unc(f"private\\{name}")
        with (
            pytest.raises(SMBOSError) as denied,
            smbclient.open_file(unc, mode, **site.session("bob")),
        ):
            pass
        assert denied.value.ntstatus == NtStatus.STATUS_ACCESS_DENIED
    assert not (site.vol / "private" / "bob.txt").exists()


def test_a_private_directory_is_a_share_for_those_it_is_granted_to(site: Site) -> None:
    assert "plans.txt" in site.ok("ls", share="private")  # smbd resolves it as root first
    done = site.smbclient("get plans.txt plans-bob2.txt", user="bob", share="private")
    assert "NT_STATUS_ACCESS_DENIED" in done.stdout + done.stderr
    assert not (site.tmp / "plans-bob2.txt").exists()
    # alice may write there, not give files away: her new file keeps the hub's owner
    (site.tmp / "draft.txt").write_bytes(b"alice's draft")
    done = site.smbclient("put draft.txt draft.txt", share="private")
    assert "NT_STATUS" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert (site.vol / "private" / "draft.txt").read_bytes() == b"alice's draft"


def test_a_read_only_share_refuses_changes(site: Site) -> None:
    (site.tmp / "ro.txt").write_bytes(b"ro")
    done = site.smbclient("put ro.txt ro.txt", share="frozen")
    assert (
        "NT_STATUS_ACCESS_DENIED" in done.stdout + done.stderr
        or "NT_STATUS_MEDIA_WRITE_PROTECTED" in done.stdout
    )
    assert not (site.vol / "ro.txt").exists()


def test_smb_and_s3_see_each_others_writes_at_once(site: Site) -> None:
    data = os.urandom(300_000)
    with smbclient.open_file(site.unc("cross.bin"), "wb", **site.session("alice")) as f:
        f.write(data)
    assert site.s3().get_object(Bucket="data", Key="cross.bin")["Body"].read() == data

    async def rest_read() -> bytes:
        rest = RestNamespace(site.hub.url)
        try:
            return await rest.read_bytes(SYSTEM, "/data/cross.bin")
        finally:
            await rest.close()

    assert asyncio.run(rest_read()) == data
    site.s3().put_object(Bucket="data", Key="from-s3.txt", Body=b"written over S3")
    with smbclient.open_file(site.unc("from-s3.txt"), "rb", **site.session("alice")) as f:
        assert f.read() == b"written over S3"


def test_audit_records_smb_and_the_user(site: Site) -> None:
    name = f"audited-{uuid.uuid4().hex[:8]}.txt"
    with smbclient.open_file(site.unc(name), "wb", **site.session("bob")) as f:
        f.write(b"x")
    reader = AuditReader(site.tmp / "site" / "audit")

    def written() -> list[tuple[str, str, str]]:
        found = [(r.user, r.protocol, r.site) for r in reader.query(path_prefix=f"/data/{name}")
                 if r.op == "write"]  # fmt: skip
        assert found
        return found

    assert set(_eventually(written)) == {("bob", "smb", "west")}


def test_a_large_file_round_trips(site: Site) -> None:
    big = site.tmp / "big.bin"
    with big.open("wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
    site.ok("put big.bin big.bin; get big.bin big.back")
    assert (site.vol / "big.bin").stat().st_size == 64 << 20
    assert (
        subprocess.run(["cmp", str(big), str(site.tmp / "big.back")], check=False).returncode == 0
    )
    assert subprocess.run(["cmp", str(big), str(site.vol / "big.bin")], check=False).returncode == 0


def test_an_open_file_survives_a_rename_over_it_and_its_deletion(site: Site) -> None:
    kw = site.session("alice")
    for name, body in (("victim.txt", b"old content"), ("newer.txt", b"new content")):
        with smbclient.open_file(site.unc(name), "wb", **kw) as f:
            f.write(body)

    async def rest_rename() -> None:
        rest = RestNamespace(site.hub.url)
        try:
            await rest.rename(SYSTEM, "/data/newer.txt", "/data/victim.txt", overwrite=True)
        finally:
            await rest.close()

    with smbclient.open_file(site.unc("victim.txt"), "rb", share_access="rwd", **kw) as reader:
        # Samba keeps Windows's rule: no rename over a file someone has open...
        with pytest.raises(SMBOSError) as refused:
            smbclient.replace(site.unc("newer.txt"), site.unc("victim.txt"), **kw)
        assert refused.value.ntstatus == NtStatus.STATUS_ACCESS_DENIED
        # ...but another protocol may, and the open file reads on as it was opened
        asyncio.run(rest_rename())
        assert reader.read() == b"old content"
    with smbclient.open_file(site.unc("victim.txt"), "rb", share_access="rwd", **kw) as reader:
        smbclient.remove(site.unc("victim.txt"), **kw)  # pending until the last close
        assert reader.read() == b"new content"
    assert "victim.txt" not in smbclient.listdir(site.unc(""), **kw)
    assert not (site.vol / "victim.txt").exists()


def test_names_are_case_sensitive(site: Site) -> None:
    kw = site.session("alice")
    for name, body in (("Case.txt", b"upper"), ("case.txt", b"lower")):
        with smbclient.open_file(site.unc(name), "wb", **kw) as f:
            f.write(body)
    assert (site.vol / "Case.txt").read_bytes() == b"upper"
    assert (site.vol / "case.txt").read_bytes() == b"lower"
    with smbclient.open_file(site.unc("case.txt"), "rb", **kw) as f:
        assert f.read() == b"lower"


def test_timestamps_set_over_smb_land_in_the_namespace(site: Site) -> None:
    kw = site.session("alice")
    with smbclient.open_file(site.unc("dated.txt"), "wb", **kw) as f:
        f.write(b"dated")
    when = 1_600_000_000  # 2020-09-13
    smbclient.utime(site.unc("dated.txt"), times=(when, when), **kw)
    assert int((site.vol / "dated.txt").stat().st_mtime) == when
    assert int(smbclient.stat(site.unc("dated.txt"), **kw).st_mtime) == when


def test_a_write_time_set_while_the_file_is_written_keeps_the_writes(site: Site) -> None:
    """Samba sets a file's write time while a client is still writing it (the client's
    SetInfo, or its own deferred update); the writes after it must land too."""
    kw = site.session("alice")
    first, second = os.urandom(1 << 20), os.urandom(1 << 20)
    with smbclient.open_file(site.unc("timed.bin"), "wb", share_access="rwd", **kw) as f:
        f.write(first)
        f.flush()
        smbclient.utime(site.unc("timed.bin"), times=(1_600_000_000, 1_600_000_000), **kw)
        f.write(second)
    assert (site.vol / "timed.bin").read_bytes() == first + second


def test_extended_attributes_are_tags(site: Site) -> None:
    kw = site.session("alice")
    with smbclient.open_file(site.unc("tagged.txt"), "wb", **kw) as f:
        f.write(b"t")
    smbclient.setxattr(site.unc("tagged.txt"), b"project", b"atlas", **kw)

    async def tags() -> dict[str, str]:
        rest = RestNamespace(site.hub.url)
        try:
            return await rest.get_tags(SYSTEM, "/data/tagged.txt")
        finally:
            await rest.close()

    assert asyncio.run(tags()) == {"project": "atlas"}
    assert smbclient.getxattr(site.unc("tagged.txt"), b"project", **kw) == b"atlas"


def test_a_new_password_works_without_a_restart(site: Site) -> None:
    cli_ok(site.tmp / "site", "--hub", site.hub.url, "user", "passwd", "bob", "--stdin",
           stdin=b"bob-New-3\n")  # fmt: skip
    try:
        _eventually(lambda: site.ok("ls", user="bob", password="bob-New-3"))
        done = site.smbclient("ls", user="bob")
        assert "NT_STATUS_LOGON_FAILURE" in done.stdout + done.stderr
    finally:
        cli_ok(site.tmp / "site", "--hub", site.hub.url, "user", "passwd", "bob", "--stdin",
               stdin=f"{PASSWORDS['bob']}\n".encode())  # fmt: skip
        _eventually(lambda: site.ok("ls", user="bob"))
        smbclient.reset_connection_cache()


def test_a_share_added_at_run_time_is_served_until_removed(site: Site) -> None:
    """``loomfs export smb add`` through the running hub: smbd serves the share without a
    restart, also to a session opened before (that one fails without the reload message),
    read-only as asked; ``export ls`` lists it beside the config's, each with its source;
    after ``export smb rm`` the next connection is refused. NFS exports are added and
    removed by the same commands."""
    at = (site.tmp / "site", "--hub", site.hub.url)
    kw = site.session("alice")
    smbclient.listdir(site.unc("", share="data"), **kw)  # a session from before the change
    said = cli_ok(*at, "export", "smb", "add", "late", "/data/private", "--access", "ro")
    assert "sharing /data/private over SMB as late: ro" in said
    assert "plans.txt" in _eventually(lambda: smbclient.listdir(site.unc("", "late"), **kw))
    assert "plans.txt" in site.ok("ls", share="late")
    (site.tmp / "late.txt").write_bytes(b"late")
    done = site.smbclient("put late.txt late.txt", share="late")
    assert "NT_STATUS_ACCESS_DENIED" in done.stdout + done.stderr or (
        "NT_STATUS_MEDIA_WRITE_PROTECTED" in done.stdout
    )
    cli_ok(*at, "export", "nfs", "add", "/data/private", "--clients", "10.0.0.0/8",
           "--access", "ro", "--squash", "all")  # fmt: skip
    rows = [json.loads(line) for line in cli_ok(*at, "export", "ls", "--json").splitlines()]
    seen = {(r["protocol"], r["name"], r["path"], r["source"]) for r in rows}
    assert {("smb", "late", "/data/private", "catalog"), ("smb", "data", "/data", "config"),
            ("nfs", "/data/private", "/data/private", "catalog"), ("nfs", "/", "/", "config"),
            ("s3", "data", "/data", "config")} <= seen  # fmt: skip
    (nfs,) = (r for r in rows if r["protocol"] == "nfs" and r["source"] == "catalog")
    assert nfs["settings"] == "ro, clients 10.0.0.0/8, squash all" and nfs["listen"] is None
    assert "late" in cli_ok(*at, "export", "ls")  # the table
    refused = run_cli(*at, "export", "smb", "add", "DATA", "/elsewhere")
    assert refused.returncode == 1 and b"config file" in refused.stderr
    cli_ok(*at, "export", "nfs", "rm", "/data/private")
    cli_ok(*at, "export", "smb", "rm", "late")
    smbclient.reset_connection_cache()

    def gone() -> None:
        done = site.smbclient("ls", share="late")
        assert "NT_STATUS_BAD_NETWORK_NAME" in done.stdout + done.stderr, done.stdout

    _eventually(gone)
    assert not any(r["source"] == "catalog" for r in map(
        json.loads, cli_ok(*at, "export", "ls", "--json").splitlines()))  # fmt: skip
    site.ok("ls")  # the config's shares serve on


def test_smbd_is_started_again_when_it_dies(site: Site) -> None:
    pid_file = site.tmp / "site" / "smb" / "samba" / "pid" / "smbd.pid"
    pid = int(pid_file.read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    smbclient.reset_connection_cache()

    def serving_again() -> str:
        assert int(pid_file.read_text().split()[0]) != pid
        return site.ok("ls")

    assert "private" in _eventually(serving_again)


# -- a spoke serving SMB -------------------------------------------------------------------------


async def _prepare_hub_and_spoke(hub_dir: Path, spoke_dir: Path, data: Path) -> None:
    hub_catalog = open_catalog(f"sqlite://{hub_dir / 'catalog.db'}")
    await hub_catalog.open()
    try:
        await HubNamespace(hub_catalog).add_volume("/datasets/d", f"posix://{data}")
        await SiteRegistry(hub_catalog).add((spoke_dir / "identity" / "site.pem").read_bytes())
        # the spoke has no region=eu label: what is below eu/ may not go there
        await PolicyStore(hub_catalog).put(
            Policy.build("eu-only", ["/datasets/d/eu/**"], ["region=eu"])
        )
        # a private directory, shared as is: only carol may enter it
        acl = AclStore(hub_catalog)
        await acl.set_private("/datasets/d/lab", True)
        await acl.grant("user:carol", "write", "/datasets/d/lab")
    finally:
        await hub_catalog.close()
    # a spoke's logins are its own: its users live in its own site catalog
    spoke_catalog = open_catalog(f"sqlite://{spoke_dir / 'catalog.db'}")
    await spoke_catalog.open()
    try:
        users = UserRegistry(spoke_catalog)
        await users.add_user("carol")
        await users.set_smb_password("carol", nt_hash("carol-Secret-4"))
    finally:
        await spoke_catalog.close()


def test_a_spoke_serves_smb_and_refuses_what_may_not_go_there(tmp_path: Path) -> None:
    """A spoke's shares, one of them a private directory (which smbd, as root, must
    resolve before it becomes the user: the spoke looks it up as itself)."""
    hub_dir, spoke_dir, data = tmp_path / "hub", tmp_path / "spoke", tmp_path / "data"
    (data / "eu").mkdir(parents=True)
    (data / "lab").mkdir()
    (data / "lab" / "notes.txt").write_bytes(b"carol's lab notes")
    (data / "in.txt").write_bytes(b"from the hub\n" * 1000)
    (data / "eu" / "resident.txt").write_bytes(b"stays in the EU")
    SiteIdentity.create(hub_dir / "identity", "hub-eu")
    SiteIdentity.create(spoke_dir / "identity", "gpu-west")
    asyncio.run(_prepare_hub_and_spoke(hub_dir, spoke_dir, data))
    (tmp_path / "out.txt").write_bytes(b"written at the spoke over SMB")
    with HubProcess(hub_dir, {"LOOMFS_FABRIC__LISTEN": "127.0.0.1:0"}) as hub:
        env = {"LOOMFS_SMB__LISTEN": "127.0.0.1:0",
               "LOOMFS_SMB__SHARES": '{"d": {"path": "/datasets/d"}, '
                                     '"lab": {"path": "/datasets/d/lab"}}'}  # fmt: skip
        args = spoke_args(hub_dir, hub.urls["fabric"], "/datasets/d")
        with SpokeProcess(spoke_dir, env, args=args) as spoke:
            port = str(int(spoke.urls["smb"].rpartition(":")[2]))

            def smb(commands: str, share: str = "d") -> str:
                done = subprocess.run(
                    ["smbclient", f"//127.0.0.1/{share}", "-p", port, "-m", "SMB3",
                     "-U", "carol%carol-Secret-4", "-c", commands],
                    capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
                )  # fmt: skip
                return done.stdout + done.stderr

            out = smb("get in.txt in.txt; put out.txt out.txt")
            assert "NT_STATUS" not in out, out
            refused = smb("get eu\\resident.txt resident.txt")
            lab = smb("get notes.txt notes.txt; put out.txt mine.txt", share="lab")
            assert "NT_STATUS" not in lab, lab
    assert (tmp_path / "in.txt").read_bytes() == (data / "in.txt").read_bytes()
    # without write-back a spoke's write is the hub's before it is acknowledged
    assert (data / "out.txt").read_bytes() == b"written at the spoke over SMB"
    assert (tmp_path / "notes.txt").read_bytes() == b"carol's lab notes"
    assert (data / "lab" / "mine.txt").read_bytes() == b"written at the spoke over SMB"
    assert "NT_STATUS_ACCESS_DENIED" in refused or "NT_STATUS_OBJECT_NAME_NOT_FOUND" in refused
    got = tmp_path / "resident.txt"
    assert not got.exists() or got.read_bytes() == b""


def _dead(pid: int) -> bool:
    """Gone, or a zombie its parent (init, for what left smbd's group) has yet to reap."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_stopping_the_hub_stops_smbd_and_its_helpers_and_unmounts(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    cli_ok(site, "user", "add", "dora", "--offline")
    cli_ok(site, "user", "passwd", "dora", "--stdin", "--offline", stdin=b"dora-Secret-5\n")
    env = {"LOOMFS_SMB__LISTEN": "127.0.0.1:0"}
    conf_path = site / "smb" / "smb.conf"
    with HubProcess(site, env=env) as hub:
        port = hub.urls["smb"].rpartition(":")[2]
        # a share listing is an RPC: smbd starts samba-dcerpcd, which leaves its group
        listing = subprocess.run(
            ["smbclient", "-L", "127.0.0.1", "-p", port, "-U", "dora%dora-Secret-5"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert "loomfs" in listing.stdout, listing.stdout + listing.stderr
        running = running_with(conf_path)
        assert len(running) >= 2  # smbd, its helpers
        assert (mount_dir(site / "smb") / "mnt").is_dir()
        mounts = Path("/proc/self/mounts").read_text()
        assert "/run/loomfs-smb/" in mounts
    assert running_with(conf_path) == []
    assert all(_dead(pid) for pid in running)
    assert Path("/proc/self/mounts").read_text().count("/run/loomfs-smb/") < mounts.count(
        "/run/loomfs-smb/"
    )
    assert not mount_dir(site / "smb").exists()


def test_a_killed_hub_takes_its_smbd_with_it(tmp_path: Path) -> None:
    """kill -9 of the hub gives it no chance to stop smbd or samba-dcerpcd (the RPC
    services, which a share listing starts): both go by themselves, with their workers."""
    site = tmp_path / "site"
    site.mkdir()
    cli_ok(site, "user", "add", "erin", "--offline")
    cli_ok(site, "user", "passwd", "erin", "--stdin", "--offline", stdin=b"erin-Secret-6\n")
    conf_path = site / "smb" / "smb.conf"
    hub = HubProcess(site, env={"LOOMFS_SMB__LISTEN": "127.0.0.1:0"}).start()
    try:
        smbd = int((site / "smb" / "samba" / "pid" / "smbd.pid").read_text().split()[0])
        assert smbd in running_with(conf_path)
        port = hub.urls["smb"].rpartition(":")[2]
        listing = subprocess.run(
            ["smbclient", "-L", "127.0.0.1", "-p", port, "-U", "erin%erin-Secret-6"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert "loomfs" in listing.stdout, listing.stdout + listing.stderr
        running = running_with(conf_path)
        assert len(running) >= 3  # smbd, samba-dcerpcd, its RPC workers
        hub.kill()  # its process group; smbd is in a session of its own

        def gone() -> None:
            assert [pid for pid in running if not _dead(pid)] == []

        _eventually(gone)
    finally:
        hub.stop()
        kill_all(running_with(conf_path))  # what the old code left
        subprocess.run(["fusermount3", "-u", "-z", str(mount_dir(site / "smb") / "mnt")],
                       capture_output=True, check=False)  # fmt: skip
