"""Listings that send only what changed: a spoke that holds a directory's listing gets the
entries changed since, and its listing is the hub's after every change.

Over a real spoke and the link emulator, random sequences of changes at the hub (files
written, removed, renamed within and across directories, directories renamed, removed and
made, modes changed, a write landing while the spoke lists) leave each directory's listing
at the spoke equal to the hub's, and a re-listing of a large directory after a few changes
costs a fraction of its first listing on the link. The codec's digest check refuses an
answer that does not come out as the hub's listing.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs.core.types import SYSTEM, Change, ChangeOp, Entry, EntryKind, Principal
from loomfs.errors import LoomError
from loomfs.namespace import listing
from loomfs.namespace.base import Namespace
from loomfs.testing.fabric import Fabric, fabric
from loomfs.testing.loop import LoopThread

WHO = Principal(user="tester", site="spoke", protocol="test")
BIG = 100  # files of the large directory, whose re-listings are measured
NAMES = [f"f{i:03}" for i in range(BIG)] + ["new1", "new2", "d0", "d1", "d2"]
SUBS = ("d0", "d1", "d2")

OP = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(["", *SUBS]), st.sampled_from(NAMES)),
    st.tuples(st.just("remove"), st.sampled_from(["", *SUBS]), st.sampled_from(NAMES)),
    st.tuples(st.just("rename"), st.sampled_from(["", *SUBS]), st.sampled_from(NAMES)),
    st.tuples(st.just("chmod"), st.sampled_from(["", *SUBS]), st.sampled_from(NAMES)),
    st.tuples(st.just("mkdir"), st.just(""), st.sampled_from(SUBS)),
    st.tuples(st.just("while listing"), st.just(""), st.sampled_from(NAMES)),
)
STEPS = st.lists(st.lists(OP, min_size=1, max_size=3), min_size=1, max_size=4)


async def listed(ns: Namespace, path: str) -> list[Entry]:
    return [entry async for entry in ns.list(WHO, path)]


async def dirs(env: Fabric, top: str) -> list[str]:
    """The directories at and below ``top`` as the hub has them."""
    found = [top]
    async for entry in env.hub.namespace.walk(SYSTEM, top):
        if entry.is_dir:
            found.append(entry.path)
    return found


async def change(env: Fabric, top: str, op: tuple[str, str, str], n: int) -> None:
    """One change at the hub; one that can't be made (a missing name, a file where a
    directory is) is left out, as the hub refuses it."""
    hub = env.hub.namespace
    how, sub, name = op
    path = "/".join(p for p in (top, sub, name) if p)
    with contextlib.suppress(LoomError):
        if how == "write":
            await hub.write_bytes(SYSTEM, path, f"{path} {n}".encode())
        elif how == "remove":
            await hub.remove(SYSTEM, path, recursive=True)
        elif how == "rename":  # somewhere else: the other directory, or a new name
            target = f"{top}/{NAMES[(NAMES.index(name) + n) % len(NAMES)]}"
            if sub == "":
                target = f"{top}/{SUBS[n % len(SUBS)]}/{name}"
            await hub.rename(SYSTEM, path, target, overwrite=True)
        elif how == "chmod":
            await hub.set_attrs(SYSTEM, path, mode=0o600 + n % 64)
        elif how == "mkdir":
            await hub.mkdir(SYSTEM, path)
        elif how == "while listing":  # the spoke lists while the hub changes the directory
            await asyncio.gather(listed(env.spoke, top), hub.write_bytes(SYSTEM, path, b"!"))


def test_held_listings_follow_random_changes_and_move_only_what_changed(tmp_path: Path) -> None:
    with LoopThread() as loop:
        made = fabric(tmp_path)
        env = loop.run(made.__aenter__())
        hub = env.hub.namespace
        rounds = iter(range(1_000))
        try:

            async def setup(top: str) -> int:
                # made in the volume and found by a rescan: one commit, not a hundred
                where = env.volume / top.removeprefix("/vol/")
                (where / "d0").mkdir(parents=True)
                (where / "d1").mkdir()
                for name in NAMES[:BIG]:
                    (where / name).write_bytes(name.encode())
                (where / "d0" / "f000").write_bytes(b"below")
                await env.hub.rescan("/vol", lambda _: None)
                await env.caught_up()
                before = env.link.down.bytes + env.link.up.bytes
                await listed(env.spoke, top)
                first = env.link.down.bytes + env.link.up.bytes - before
                async for _ in env.spoke.walk(WHO, top):  # every directory held
                    pass
                return first

            async def step(top: str, ops: list[tuple[str, str, str]], first: int) -> None:
                for op in ops:
                    await change(env, top, op, next(rounds))
                await env.caught_up()
                before = env.link.down.bytes + env.link.up.bytes
                again = await listed(env.spoke, top)
                moved = env.link.down.bytes + env.link.up.bytes - before
                assert again == await listed(hub, top)
                # a few entries changed of about a hundred: a fraction of the whole
                assert moved < first / 3, (moved, first)
                for directory in await dirs(env, top):
                    assert await listed(env.spoke, directory) == await listed(hub, directory)

            @settings(
                max_examples=5,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(STEPS)
            def run(steps: list[list[tuple[str, str, str]]]) -> None:
                top = f"/vol/l{next(rounds)}"
                first = loop.run(setup(top))
                for ops in steps:
                    loop.run(step(top, ops, first))

            run()
        finally:
            loop.run(made.__aexit__(None, None, None))


def test_a_delta_names_what_the_log_changed_and_a_wrong_one_is_refused() -> None:
    def entry(name: str, version: int) -> Entry:
        return Entry(f"/d/{name}", EntryKind.FILE, 1, 0, 0o644, 0, 0, version)

    def logged(op: ChangeOp, path: str, new_path: str | None = None) -> Change:
        return Change(9, op, path, EntryKind.FILE, 9, 0, new_path)

    held = {"a": entry("a", 1), "b": entry("b", 1)}
    now = [entry("a", 1), entry("c", 2)]
    log = [logged(ChangeOp.RENAME, "/d/b", "/d/c"), logged(ChangeOp.META, "/d")]
    answer = listing.delta("/d", now, log, listing.digest(held.values()))
    assert (answer.full, answer.entries, answer.gone) == (False, [now[1]], ["b"])
    assert list((listing.applied(held, answer) or {}).values()) == now
    # a change the log does not name (an access rule): the result is not the hub's
    missed = listing.delta("/d", now, [], listing.digest(held.values()))
    assert listing.applied(held, missed) is None
    assert listing.delta("/d", now, [], listing.digest(now)).unchanged
    for moved in ([logged(ChangeOp.RENAME, "/x", "/d")], [logged(ChangeOp.DELETE, "/")], None):
        whole = listing.delta("/d", now, moved, listing.digest(held.values()))
        assert whole.full and listing.applied(held, whole) == {e.name: e for e in now}
