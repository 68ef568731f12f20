"""Creates deferred to the close (``loomfs mount --defer-creates``, what ``serve smb`` runs)
and the extended attributes of listed names: through a real mount process, checked against
a local directory given the same calls, against the hub's namespace read directly (never
through the mount), and in the audit."""

from __future__ import annotations

import asyncio
import errno
import os
import pwd
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from loomfs.config import load_config
from loomfs.core.acl import AclStore
from loomfs.core.audit import AuditReader
from loomfs.core.types import SYSTEM
from loomfs.core.users import UserRegistry
from loomfs.errors import NotFound
from loomfs.namespace.base import Namespace
from loomfs.service import HubService
from loomfs.testing.fuse import FUSE_MISSING, MountProcess, prepare_site

USER = "alice"
#: a directory alice may read and list but not write
READ_ONLY = "/vol/ro"
NAMES = ("a", "b", "c")
#: a second caller of the mount, as its local user name (not mapped)
NOBODY = 65534


@dataclass
class Site:
    mnt: Path
    data_dir: Path
    runner: asyncio.Runner
    ns: Namespace

    def files(self, top: str) -> dict[str, bytes]:
        """What the namespace holds in ``top``: name -> content."""

        async def view() -> dict[str, bytes]:
            out = {}
            async for entry in self.ns.list(SYSTEM, top):
                out[entry.name] = await self.ns.read_bytes(SYSTEM, entry.path)
            return out

        return self.runner.run(view())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if not os.path.exists("/dev/fuse"):
        pytest.fail(FUSE_MISSING)
    root = tmp_path_factory.mktemp("fusecreate")
    volume = root / "volume"
    (volume / "ro").mkdir(parents=True)
    (root / "site").mkdir()
    config = prepare_site(root / "site", {"/vol": volume})

    async def rules() -> None:
        service = HubService(load_config(config))
        await service.start()
        try:
            await UserRegistry(service.catalog).add_user(USER)
            acl = AclStore(service.catalog)
            await acl.set_private(READ_ONLY, True)
            await acl.grant(f"user:{USER}", "read", READ_ONLY)
        finally:
            await service.stop()

    asyncio.run(rules())
    mnt = root / "mnt"
    mount = MountProcess(
        config, mnt, "--uid-map", f"{os.getuid()}={USER}", "--defer-creates", "--allow-other"
    )
    with mount, asyncio.Runner() as runner:
        service = HubService(load_config(config))
        runner.run(service.catalog.open())
        runner.run(service.namespace.load_volumes())
        try:
            yield Site(mnt, root / "site" / "data", runner, service.namespace)
        finally:
            runner.run(service.namespace.close())
            runner.run(service.catalog.close())
    assert "Traceback" not in mount.log(), mount.log()


def _fresh(site: Site) -> tuple[Path, str]:
    name = uuid.uuid4().hex[:10]
    (site.mnt / "vol" / name).mkdir()
    return site.mnt / "vol" / name, f"/vol/{name}"


def _outcome(call: Callable[..., object], *args: object) -> object:
    try:
        return call(*args)
    except OSError as exc:
        return f"errno {exc.errno}"


@dataclass
class Model:
    """What the files of one directory are, by identity: which have never been closed
    since their create (pending), and which were written since their last close."""

    names: dict[str, int] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)
    dirty: set[int] = field(default_factory=set)
    #: open descriptors: (on the mount, on the local disk, the file)
    fds: list[tuple[int, int, int]] = field(default_factory=list)
    made: int = 0


Op = tuple[str, int, int, bytes]
OPS = hs.lists(
    hs.tuples(
        hs.sampled_from(["create", "write", "rename", "unlink", "close"]),
        hs.integers(0, 5),
        hs.integers(0, 5),
        hs.binary(min_size=1, max_size=64),
    ),
    max_size=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_after_each_close_the_namespace_holds_what_a_local_disk_does(
    site: Site, tmp_path: Path, ops: list[Op]
) -> None:
    """Random creates, writes, renames, unlinks and closes, made through the mount and in
    a local directory alike: each gets the same answer on both; the mount shows what the
    disk shows at every step, and after each close the namespace holds the disk's files
    but those never closed since their create, each (unless written since its last
    close) with the disk's bytes."""
    mnt, top = _fresh(site)
    local = tmp_path / uuid.uuid4().hex
    local.mkdir()
    model = Model()
    try:
        for kind, i, j, data in ops:
            a, b = NAMES[i % 3], NAMES[j % 3]
            if kind == "create":
                flags = os.O_CREAT | os.O_WRONLY | os.O_TRUNC
                got = _outcome(os.open, mnt / a, flags, 0o640)
                want = _outcome(os.open, local / a, flags, 0o640)
                assert isinstance(got, int) == isinstance(want, int), (got, want)
                if isinstance(got, int) and isinstance(want, int):
                    fid = model.names.get(a)
                    if fid is None:
                        fid = model.names[a] = model.made = model.made + 1
                        model.pending.add(fid)
                    model.dirty.add(fid)
                    model.fds.append((got, want, fid))
            elif kind in ("write", "close") and model.fds:
                fd_m, fd_l, fid = model.fds[i % len(model.fds)]
                if kind == "write":
                    assert os.pwrite(fd_m, data, j) == os.pwrite(fd_l, data, j)
                    model.dirty.add(fid)
                else:
                    model.fds.remove((fd_m, fd_l, fid))
                    os.close(fd_l)
                    os.close(fd_m)
                    model.pending.discard(fid)
                    model.dirty.discard(fid)
                    held = {n: f for n, f in model.names.items() if f not in model.pending}
                    now = site.files(top)
                    assert sorted(now) == sorted(held)
                    for name, fid in held.items():
                        if fid not in model.dirty:
                            assert now[name] == (local / name).read_bytes(), name
            elif kind == "rename":
                got = _outcome(os.rename, mnt / a, mnt / b)
                assert got == _outcome(os.rename, local / a, local / b)
                if got is None and a != b:
                    model.names[b] = model.names.pop(a)
            elif kind == "unlink":
                got = _outcome(os.unlink, mnt / a)
                assert got == _outcome(os.unlink, local / a)
                if got is None:
                    del model.names[a]
            assert sorted(os.listdir(mnt)) == sorted(os.listdir(local))
            for name in os.listdir(local):
                assert os.stat(mnt / name).st_size == os.stat(local / name).st_size, name
    finally:
        for fd_m, fd_l, _ in model.fds:
            os.close(fd_m)
            os.close(fd_l)
    # closed, every file is in the namespace as on the disk
    assert site.files(top) == {name: (local / name).read_bytes() for name in os.listdir(local)}


def test_a_pending_file_renamed_or_removed_leaves_nothing_in_the_namespace(site: Site) -> None:
    mnt, top = _fresh(site)
    with (mnt / "x").open("wb", buffering=0) as f:
        f.write(b"made")
        assert site.files(top) == {}
        assert os.listdir(mnt) == ["x"] and os.stat(mnt / "x").st_size == 4
        os.rename(mnt / "x", mnt / "y")
        assert os.listdir(mnt) == ["y"] and site.files(top) == {}
        os.unlink(mnt / "y")
        assert os.listdir(mnt) == [] and site.files(top) == {}
    assert site.files(top) == {}
    # renamed over a file in the namespace: that one goes at the rename, the new one at
    # its close
    (mnt / "old").write_bytes(b"old")
    with (mnt / "new").open("wb", buffering=0) as f:
        f.write(b"new")
        os.rename(mnt / "new", mnt / "old")
        assert site.files(top) == {}
        assert (mnt / "old").read_bytes() == b"new"
    assert site.files(top) == {"old": b"new"}
    # a directory holding a pending file is not empty
    (mnt / "d").mkdir()
    with (mnt / "d" / "f").open("wb"):
        with pytest.raises(OSError) as info:
            os.rmdir(mnt / "d")
        assert info.value.errno == errno.ENOTEMPTY


def test_a_create_the_rules_refuse_fails_at_the_create_and_writes_nothing(site: Site) -> None:
    target = site.mnt / READ_ONLY.lstrip("/") / f"no-{uuid.uuid4().hex[:6]}"
    with pytest.raises(OSError) as info:
        os.open(target, os.O_CREAT | os.O_WRONLY, 0o644)
    assert info.value.errno == errno.EACCES
    assert not target.exists()
    assert target.name not in site.files(READ_ONLY)
    with pytest.raises(NotFound):
        site.runner.run(site.ns.stat(SYSTEM, f"{READ_ONLY}/{target.name}"))
    # the refusal and an allowed create's write are alice's in the audit
    mnt, top = _fresh(site)
    (mnt / "ok").write_bytes(b"ok")
    reader = AuditReader(site.data_dir / "audit")

    def recorded() -> bool:
        refused = reader.query(path_prefix=f"{READ_ONLY}/{target.name}")
        written = [r for r in reader.query(path_prefix=f"{top}/ok") if r.op == "write"]
        return bool(refused and written)

    _wait_for(recorded)
    refused = reader.query(path_prefix=f"{READ_ONLY}/{target.name}")
    assert [(r.user, r.result) for r in refused if r.op == "write"] == [(USER, "denied")]
    written = [r for r in reader.query(path_prefix=f"{top}/ok") if r.op == "write"]
    assert [(r.user, r.result) for r in written] == [(USER, "ok")]


def test_a_listing_answers_its_names_extended_attributes_for_its_caller_alone(
    site: Site,
) -> None:
    """After a listing, the extended attributes of its names are answered from what the
    listing carried (one get_tags of the directory in the audit, none of a name) for the
    user it was made for; another user's ask of a name goes to the namespace as theirs."""
    mnt, top = _fresh(site)
    for name in "xyz":
        (mnt / name).write_bytes(b"1")
    os.setxattr(mnt / "y", "user.k", b"v")
    os.setxattr(mnt / "z", "user.k", b"w")
    assert sorted(os.listdir(mnt)) == ["x", "y", "z"]
    assert [os.listxattr(mnt / name) for name in "xyz"] == [[], ["user.k"], ["user.k"]]
    assert os.getxattr(mnt / "z", "user.k") == b"w"
    other = pwd.getpwuid(NOBODY).pw_name
    # opened here and handed over: the test's directories are closed to that user
    fd = os.open(mnt / "y", os.O_RDONLY)
    try:
        argv = ["getfattr", "--absolute-names", "-d", f"/proc/self/fd/{fd}"]
        seen = subprocess.run(argv, user=NOBODY, pass_fds=[fd], capture_output=True,
                              text=True, check=False)  # fmt: skip
    finally:
        os.close(fd)
    assert 'user.k="v"' in seen.stdout, seen.stderr
    reader = AuditReader(site.data_dir / "audit")

    def asked() -> list[tuple[str, str]]:
        return [(r.user, r.path) for r in reader.query(path_prefix=top) if r.op == "get_tags"]

    _wait_for(lambda: (other, f"{top}/y") in asked())
    assert {user: {path for u, path in asked() if u == user} for user, _ in asked()} == {
        USER: {top},
        other: {f"{top}/y"},
    }


def _wait_for(check: Callable[[], bool]) -> None:
    """The mount process writes its audit records in the background: a generous
    deadline, never a timing claim."""
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, "timed out waiting for the audit records"
        time.sleep(0.1)
