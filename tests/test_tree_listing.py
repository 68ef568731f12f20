"""A tree's listings in one request are the listings its caller gets one directory at a time.

Over a real spoke and the link emulator, random trees with random rights (directories made
private, some granted to the caller to list or read): the hub's tree answer
(``POST /v1/tree``) names the same directories in the same order as a walk by per-directory
listings, each with the same entries, and where a directory is refused it ends with that
directory's error, with nothing of it or past it. A spoke's walk, first with nothing held
and then again over the listings the first one kept (answered as deltas), yields what
walking the hub's listings yields.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs.core.types import SYSTEM, Entry, Principal
from loomfs.errors import LoomError
from loomfs.namespace.base import Namespace
from loomfs.namespace.listing import ListingDelta
from loomfs.testing.fabric import Fabric, fabric
from loomfs.testing.loop import LoopThread

WHO = Principal(user="tester", site="spoke", protocol="test")
# directories as paths of names below the tree's top, files as a directory and a name
DIRS = st.lists(st.lists(st.sampled_from("abc"), min_size=1, max_size=3).map("/".join), max_size=6)
TREES = st.tuples(
    DIRS,
    st.lists(st.tuples(st.integers(0, 6), st.sampled_from(["x", "y"])), max_size=6),
    st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from(["private", "list", "read"])), max_size=4
    ),
    st.integers(0, 6),  # a directory made private, walked from as well as the top
)
Tree = tuple[list[str], list[tuple[int, str]], list[tuple[int, str]], int]

Walked = tuple[list[Entry], type[LoomError] | None]


async def walked(entries: AsyncIterator[Entry]) -> Walked:
    """What a walk yields, and the class of the error that ends it, if one does."""
    out: list[Entry] = []
    try:
        async for entry in entries:
            out.append(entry)
    except LoomError as exc:
        return out, type(exc)
    return out, None


async def per_directory(ns: Namespace, top: str) -> list[tuple[str, list[Entry] | str]]:
    """Each directory a walk by listings meets, with its listing or the code of the error
    that ends the walk there."""
    out: list[tuple[str, list[Entry] | str]] = []
    pending = [top]
    while pending:
        directory = pending.pop()
        try:
            entries = [entry async for entry in ns.list(WHO, directory)]
        except LoomError as exc:
            out.append((directory, exc.code))
            return out
        out.append((directory, entries))
        pending += reversed([e.path for e in entries if e.is_dir])
    return out


async def make(env: Fabric, top: str, tree: Tree) -> list[str]:
    """The tree made below ``top``, its rights set; the directories to walk from."""
    dirs, files, rights, private = tree
    hub, store = env.hub.namespace, env.hub.authorizer.store
    made = [top, *(f"{top}/{d}" for d in dirs)]
    for directory in made:
        await hub.mkdir(SYSTEM, directory, parents=True, exist_ok=True)
    for at, name in files:
        await hub.write_bytes(SYSTEM, f"{made[at % len(made)]}/{name}", name.encode())
    for at, right in [(private, "private"), *rights]:
        if right == "private":
            await store.set_private(made[at % len(made)], True)
        else:
            await store.grant(f"user:{WHO.user}", right, made[at % len(made)])
    await env.hub.authorizer.reload()
    await env.caught_up()
    return [top, made[private % len(made)]]


def test_a_trees_listings_are_the_per_directory_listings_of_the_same_user(
    tmp_path: Path,
) -> None:
    with LoopThread() as loop:
        made = fabric(tmp_path)
        env = loop.run(made.__aenter__())
        tops = (f"/vol/t{n}" for n in itertools.count())
        denied: list[bool] = []  # per walk: whether it ended refused
        try:

            async def check(tree: Tree) -> None:
                for top in await make(env, next(tops), tree):
                    await check_walk(top)

            async def check_walk(top: str) -> None:
                link = env.spoke.hub
                expected = await per_directory(link, top)
                got = [one async for one in link.list_tree(WHO, top, {})]
                assert [d for d, _ in got] == [d for d, _ in expected]
                for (_, answer), (_, listing) in zip(got, expected, strict=True):
                    if isinstance(listing, str):
                        assert isinstance(answer, LoomError) and answer.code == listing
                    else:
                        assert isinstance(answer, ListingDelta) and answer.full
                        assert answer.entries == listing
                by_hub = await walked(link.walk(WHO, top))
                assert await walked(env.spoke.walk(WHO, top)) == by_hub
                assert await walked(env.spoke.walk(WHO, top)) == by_hub  # over held copies
                denied.append(by_hub[1] is not None)

            @settings(
                max_examples=6,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(TREES)
            def run(tree: Tree) -> None:
                loop.run(check(tree))

            run()
            assert any(denied) and not all(denied), denied  # both kinds were walked
        finally:
            loop.run(made.__aexit__(None, None, None))
