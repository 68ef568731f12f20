"""An attacker's suite for governance: random trees, random routes, one invariant.

Each example lays a fresh tree on the volume's disk, as other tools would: a private
secret (readable by bob only), a narrow user's home (mallory may write only there), a
public directory, and a residency-restricted one (its data may reach sites labelled
region=eu only). Hypothesis draws the traps: symlinks from the home to restricted files
(relative, absolute on the host, chains, padded with ``.`` and ``..``, links to the
directory above), hard links made behind loomfs's back, names with control characters.
Then mallory tries every route over every edge (the namespace API, REST, S3 with
CopyObject, the refused spoke's own namespace over the fabric link): reads, copies, links,
renames of ancestors, warm-ups. The invariant: no byte of a marked file reaches her, the
refused spoke's cache directory never holds a restricted marker, the restricted files are
unchanged, and the change feed names no hidden path. Positive controls make sure the
edges work at all (a suite in which every call failed would prove nothing).

``LOOMFS_ADVERSARY_EXAMPLES`` runs more examples (the default keeps ``make test`` short).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import botocore.exceptions
from botocore.config import Config as BotoConfig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs.core.acl import AclStore
from loomfs.core.placement import Policy
from loomfs.core.types import SYSTEM, Principal
from loomfs.core.users import AccessKey, UserRegistry
from loomfs.errors import LoomError
from loomfs.protocols.s3 import S3Gateway
from loomfs.rest.client import RestNamespace
from loomfs.rest.server import RestServer
from loomfs.testing.fabric import Fabric, fabric
from loomfs.testing.loop import LoopThread
from loomfs.testing.ports import serving

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

EXAMPLES = int(os.environ.get("LOOMFS_ADVERSARY_EXAMPLES", "10"))
EU, US = "gpu-eu", "gpu-us"
MiB = 1 << 20

# names a careless or hostile tool might make: control characters, spaces, dots, UTF-8
NAME = st.text(
    alphabet=st.sampled_from(["a", "b", "\n", "\t", " ", ".", "é", "\x7f", "\r"]),
    min_size=1,
    max_size=6,
).filter(lambda n: n not in (".", ".."))


@dataclass(frozen=True)
class Trap:
    """A name in mallory's home that leads somewhere it should not."""

    name: str
    kind: str  # relative | absolute | padded | chain | parent | hardlink | api
    target: str  # "secret" or "eu": what it leads to


TRAP = st.builds(
    Trap,
    NAME,
    st.sampled_from(["relative", "absolute", "padded", "chain", "parent", "hardlink", "api"]),
    st.sampled_from(["secret", "eu"]),
)


def marked(size: int) -> tuple[bytes, bytes]:
    """A fresh marker, and incompressible data holding it in every block."""
    marker = os.urandom(16).hex().encode()
    return marker, (marker + os.urandom(4096)) * (size // (len(marker) + 4096) + 1)


def holding(directory: Path, marker: bytes) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file() and marker in p.read_bytes()]


@dataclass
class World:
    env: Fabric
    keys: dict[str, AccessKey]
    rest_url: str
    s3_url: str
    cases: itertools.count[int] = field(default_factory=itertools.count)

    def who(self, user: str) -> Principal:
        return Principal(user, protocol="api")


@contextlib.asynccontextmanager
async def world(tmp: Path) -> AsyncIterator[World]:
    labels = {EU: {"region": "eu"}, US: {"region": "us"}}
    async with fabric(tmp, (EU, US), lease_ttl=3.0, labels=labels) as env:
        hub = env.hub
        users = UserRegistry(hub.catalog)
        keys = {}
        for name in ("mallory", "sam", "bob"):
            await users.add_user(name)
            keys[name] = await users.add_access_key(name)
        rest = RestServer(
            hub.governed, hub, authenticate=hub.authenticator(), governance=hub.governed
        )
        gateway = S3Gateway(
            hub.governed,
            users,
            {"vol": "/vol"},
            staging=tmp / "s3-staging",
            uploads=hub.catalog.upload_records(),
        )
        async with serving(rest.app()) as rest_url, serving(gateway.app()) as s3_url:
            yield World(env, keys, rest_url, s3_url)


@dataclass
class Case:
    top: str  # the namespace path of this example's tree
    disk: Path
    secret: bytes  # the marker of bob's private file
    eu: bytes  # the marker of the residency-restricted file
    #: the names that lead to restricted data, by the attacker whose home holds them:
    #: mallory (ACL: may write her home only) tries them at the hub, sam (may read the
    #: eu tree, so only residency stops him) at the refused spoke
    traps: dict[str, list[str]] = field(default_factory=lambda: {"mallory": [], "sam": []})


ATTACKER = {"secret": "mallory", "eu": "sam"}
TARGET = {"secret": "secret/f.bin", "eu": "eu/deep/f.bin"}


async def lay_out(w: World, traps: list[Trap]) -> Case:
    """The tree of one example, on disk and then scanned, with its rules and policy."""
    env, n = w.env, next(w.cases)
    top, disk = f"/vol/c{n}", env.volume / f"c{n}"
    secret, secret_data = marked(64 * 1024)
    eu, eu_data = marked(2 * MiB)  # big enough to go by chunks, not whole
    for sub in ("secret", "home/mallory", "home/sam", "pub", "eu/deep"):
        (disk / sub).mkdir(parents=True)
    (disk / TARGET["secret"]).write_bytes(secret_data)
    (disk / "secret" / "bobs.bin").write_bytes(secret_data)  # no trap leads here
    (disk / TARGET["eu"]).write_bytes(eu_data)
    (disk / "home" / "mallory" / "own.txt").write_bytes(b"mallory's own")
    (disk / "pub" / "open.txt").write_bytes(b"for everyone")
    # a public link to the restricted data, as an admin might make: fine at the hub, but
    # the refused site must get nothing through it
    (disk / "pub" / "to-eu").symlink_to("../" + TARGET["eu"])
    case = Case(top, disk, secret, eu)
    api_traps: list[tuple[str, str, str]] = []
    for i, trap in enumerate(traps):
        user, target = ATTACKER[trap.target], TARGET[trap.target]
        home, name, rel = disk / "home" / user, f"{trap.name}{i}", "../../" + target
        at = f"{top}/home/{user}"
        link = home / name
        match trap.kind:
            case "relative":
                link.symlink_to(rel)
            case "absolute":
                link.symlink_to(disk / target)
            case "padded":
                link.symlink_to(f"./../{user}/./" + rel.replace("/", "//./"))
            case "chain":
                (home / f"hop{i}").symlink_to(rel)
                link.symlink_to(f"hop{i}")
                case.traps[user].append(f"{at}/hop{i}")
            case "parent":  # a link to the directory above: every name under it
                link.symlink_to("../..")
                case.traps[user].append(f"{at}/{name}/{target}")
            case "hardlink":
                os.link(disk / target, link)
            case "api":  # made by the attacker, through the namespace
                api_traps.append((user, f"{at}/{name}", rel))
                continue
        case.traps[user].append(f"{at}/{name}")
    await env.hub.namespace.sync_volume("/vol", prefix=f"c{n}")
    acl = AclStore(env.hub.catalog)
    await acl.set_private(top, True)
    await acl.grant("user:bob", "read", f"{top}/secret")
    for user in ATTACKER.values():
        await acl.grant(f"user:{user}", "write", f"{top}/home/{user}")
    await acl.grant("user:sam", "read", f"{top}/eu")
    await acl.grant("group:everyone", "read", f"{top}/pub")
    await env.hub.authorizer.reload()
    policy = Policy.build(f"eu-c{n}", [f"{top}/eu/**"], ["region=eu"])
    await env.hub.settle(await env.hub.placement.store.put(policy))
    for user, path, target in api_traps:
        with contextlib.suppress(LoomError):
            await env.hub.governed.symlink(w.who(user), path, target)
            case.traps[user].append(path)
    return case


async def attempt(read: Callable[[], Awaitable[bytes]]) -> bytes | None:
    """The bytes a route returned, None where it refused (any error is a refusal)."""
    try:
        return await read()
    except (LoomError, OSError, botocore.exceptions.ClientError):
        return None


def s3_client(w: World, user: str) -> S3Client:
    key = w.keys[user]
    return boto3.client(
        "s3",
        endpoint_url=w.s3_url,
        region_name="us-east-1",
        aws_access_key_id=key.access_key,
        aws_secret_access_key=key.secret,
        config=BotoConfig(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )


def s3_get(s3: S3Client, path: str) -> bytes:
    return s3.get_object(Bucket="vol", Key=path.removeprefix("/vol/"))["Body"].read()


async def attack_at_hub(w: World, case: Case) -> None:
    """mallory, over the namespace API, REST and S3: no byte of bob's secret."""
    env, top = w.env, case.top
    mallory, key = w.who("mallory"), w.keys["mallory"]
    rest = RestNamespace(w.rest_url, credentials=(key.access_key, key.secret))
    s3 = s3_client(w, "mallory")
    try:
        # positive controls: every edge works for what mallory may read
        own = f"{top}/home/mallory/own.txt"
        assert await env.hub.governed.read_bytes(mallory, own) == b"mallory's own"
        assert await rest.read_bytes(mallory, f"{top}/pub/open.txt") == b"for everyone"
        assert await asyncio.to_thread(s3_get, s3, own) == b"mallory's own"

        def s3_copy(path: str, i: int) -> Callable[[], Awaitable[bytes]]:
            src, dst = path.removeprefix("/vol/"), f"{top}/home/mallory/copy{i}"

            def copy() -> bytes:
                s3.copy_object(Bucket="vol", Key=dst.removeprefix("/vol/"), CopySource=f"vol/{src}")
                return s3_get(s3, dst)

            return lambda: asyncio.to_thread(copy)

        routes: list[Callable[[], Awaitable[bytes]]] = []
        for i, path in enumerate([*case.traps["mallory"], f"{top}/{TARGET['secret']}"]):
            routes += [
                partial(env.hub.governed.read_bytes, mallory, path),
                partial(rest.read_bytes, mallory, path),
                partial(rest.read_bytes, mallory, path, 10, 5000),
                partial(asyncio.to_thread, s3_get, s3, path),
                s3_copy(path, i),
            ]
        # an ancestor renamed into her home, a hard link of the secret made there
        with contextlib.suppress(LoomError):
            await env.hub.governed.rename(mallory, f"{top}/secret", f"{top}/home/mallory/stolen")
        with contextlib.suppress(LoomError):
            await env.hub.governed.link(mallory, f"{top}/secret/f.bin", f"{top}/home/mallory/hl")
        for path in (f"{top}/home/mallory/stolen/f.bin", f"{top}/home/mallory/hl"):
            routes.append(partial(rest.read_bytes, mallory, path))
        for read in routes:
            data = await attempt(read)
            assert data is None or case.secret not in data, read
    finally:
        await rest.close()
    assert case.secret in (case.disk / TARGET["secret"]).read_bytes()
    # bob may read the secret: rights work, they are not just refusing everything (not
    # through f.bin, which a hard link may have put in mallory's home too: a file is
    # readable only where every name of it is)
    assert case.secret in await env.hub.governed.read_bytes(w.who("bob"), f"{top}/secret/bobs.bin")


async def attack_at_spoke(w: World, case: Case) -> None:
    """sam, at the refused spoke: no byte of the eu tree reaches him or its cache."""
    env, top = w.env, case.top
    sam, us = w.who("sam"), env.spokes[US]
    assert await us.read_bytes(sam, f"{top}/pub/open.txt") == b"for everyone"
    for src, dst in ((f"{top}/eu", f"{top}/home/sam/eu"), (f"{top}/eu/deep", f"{top}/pub/d")):
        with contextlib.suppress(LoomError):  # the policy's own directory moved out
            await us.rename(sam, src, dst)
    with contextlib.suppress(LoomError):
        await us.link(sam, f"{top}/{TARGET['eu']}", f"{top}/home/sam/hl")
    with contextlib.suppress(LoomError):
        await us.warm(sam, top)
    reads = [
        *case.traps["sam"],
        f"{top}/{TARGET['eu']}",
        f"{top}/pub/to-eu",
        f"{top}/home/sam/eu/deep/f.bin",
        f"{top}/pub/d/f.bin",
        f"{top}/home/sam/hl",
    ]
    for path in reads:
        data = await attempt(partial(us.read_bytes, sam, path))
        assert data is None or case.eu not in data, path
    assert case.eu in (case.disk / TARGET["eu"]).read_bytes()
    assert not holding(us.cache.directory, case.eu)
    # the site the policy allows reads it, through the same link
    assert case.eu in await env.spokes[EU].read_bytes(sam, f"{top}/pub/to-eu")


async def feed_names_nothing_hidden(w: World, case: Case, hidden: str) -> None:
    """A rename into the private secret directory shows to mallory as a removal."""
    env, top = w.env, case.top
    head = await env.hub.catalog.head_seq()
    await env.hub.namespace.write_bytes(SYSTEM, f"{top}/pub/moving", b"x")
    await env.hub.namespace.rename(SYSTEM, f"{top}/pub/moving", f"{top}/secret/{hidden}")
    key = w.keys["mallory"]
    rest = RestNamespace(w.rest_url, credentials=(key.access_key, key.secret))
    try:
        feed = await rest.changes(head)
    finally:
        await rest.close()
    seen = [(c.path, c.new_path or "") for c in feed.changes]
    assert (f"{top}/pub/moving", "") in seen  # she saw it come and go
    assert not any(hidden in p or hidden in q for p, q in seen)


def test_no_route_leaks(tmp_path: Path) -> None:
    with LoopThread() as loop:
        made = world(tmp_path)
        w = loop.run(made.__aenter__())
        try:

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(st.lists(TRAP, min_size=1, max_size=6), NAME)
            def run(traps: list[Trap], hidden: str) -> None:
                case = loop.run(lay_out(w, traps))
                loop.run(attack_at_hub(w, case))
                loop.run(attack_at_spoke(w, case))
                loop.run(feed_names_nothing_hidden(w, case, f"hidden-{hidden}"))

            run()
        finally:
            loop.run(made.__aexit__(None, None, None))
