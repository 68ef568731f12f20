"""A randomized history checker of the consistency contract (testing layer).

Clients at a hub and at its spokes write unique values to a few files, with and without
preconditions (``if_version``, ``exclusive``), and read them, while a fault task cuts the
spokes' links (and, if asked, restarts spokes as a crash does). Every call is recorded with
when it began and ended and what it returned; the hub's commits are recorded as they happen
(which value became which version of which path) and its change log gives each version's
predecessor. ``check`` then looks for what DESIGN.md's "Consistency contract" rules out:

- lost: an acknowledged write that never landed (at its path, or as a conflict copy when
  it was unconditional and acknowledged before the hub checked it), beyond the refusals the
  spokes reported for acknowledged conditional writes;
- duplicated: a value that landed more than once;
- precondition bypassed: a conditional write committed over another version than the one
  it named, or a create over an existing file, or as a copy;
- refused yet landed: a write its writer was told was refused;
- dirty: a read of a value the hub never committed at that version (or, at version 0, of
  another client's write not yet at the hub);
- stale: a read that began after a write was acknowledged and returned an older version,
  although its spoke's link stayed up during the read (close-to-open).

Clients are distinct users, so each one is a session: it alone reads back its own writes
not yet committed at the hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.types import ChangeOp, Entry, Principal
from ..errors import AlreadyExists, Conflict, LoomError, NotFound
from ..hub.namespace import HubNamespace
from ..namespace.base import Namespace
from ..spoke.namespace import REFUSED
from .fabric import Fabric

HUB = "hub"
TOP = "/vol/history"
OP_TIMEOUT = 60.0  # a call that takes longer counts as unanswered (its spoke may be dead)


@dataclass(slots=True)
class Op:
    """One recorded call. ``outcome``: ok, refused (a definite no), unanswered (the link
    or the spoke failed: it may or may not have happened), or failed (an unexpected error:
    a violation of its own)."""

    client: str
    site: str
    kind: str  # write, cas (if_version), create (exclusive), read
    path: str
    invoked: float
    value: str | None = None  # written, or read
    if_version: int | None = None
    completed: float = 0.0
    outcome: str = ""
    version: int | None = None
    error: str = ""


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    #: value -> where the hub committed it: [(path, version)]
    commits: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    #: path -> [(seq, op, version)] of the hub's change log, in order
    log: dict[str, list[tuple[int, ChangeOp, int]]] = field(default_factory=dict)
    #: site -> [(cut at, restored at)], restarts too
    cuts: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    restarts: int = 0
    #: acknowledged conditional writes the spokes reported refused
    refused_reported: int = 0


def observe(hub: HubNamespace, history: History) -> None:
    """Record every write the hub commits: the value it holds and the version it made
    (a repeat of an idempotency key makes no version: the first was recorded)."""
    real = hub.write

    async def write(who: Principal, path: str, data: Any, **kwargs: Any) -> Entry:
        seen = bytearray()

        async def captured() -> Any:
            async for chunk in data:
                seen.extend(chunk)
                yield chunk

        def record(done: asyncio.Future[Entry]) -> None:
            if done.cancelled() or done.exception() is not None or not seen:
                return  # not made, or answered from its key unread (recorded when made)
            entry = done.result()
            places = history.commits.setdefault(seen.decode(errors="replace"), [])
            if (entry.path, entry.version) not in places:
                places.append((entry.path, entry.version))

        writing = asyncio.ensure_future(real(who, path, captured(), **kwargs))
        writing.add_done_callback(record)
        # a caller that goes away (a request whose client hung up) leaves the write to
        # finish and be recorded: a commit it made must not go unrecorded
        return await asyncio.shield(writing)

    hub.write = write  # type: ignore[method-assign]


@dataclass
class Workload:
    """What the clients do: ``ops`` calls in all over ``files`` files, by
    ``clients_per_site`` clients at each site; a cut every ``cut_every`` seconds on
    average, for up to ``cut_for``; ``restart_spokes``: now and then a spoke dies and
    starts again over its journal (a fault like a cut, for the stale-read check);
    ``restart_hub``: now and then the hub stops and starts again over its catalog (every
    link is cut meanwhile); the spokes named in ``write_back`` acknowledge writes once
    journaled."""

    ops: int = 200
    files: int = 3
    clients_per_site: int = 2
    cut_every: float = 0.4
    cut_for: float = 1.5
    think: float = 0.05  # the most a client waits between two calls
    restart_spokes: bool = False
    restart_hub: bool = False
    write_back: frozenset[str] = frozenset()
    write_lease: float = 5.0


async def run(env: Fabric, workload: Workload, seed: int) -> History:
    """Drive the workload against ``env``'s hub and spokes, then restore every link, let
    the spokes commit their journals, and return the history."""
    rng = random.Random(seed)
    history = History()

    def watch(hub: HubNamespace) -> None:
        observe(hub, history)
        # a cut spoke's write lease outlives its writes by this much (60 s by default)
        hub.write_leases.ttl = workload.write_lease

    watch(env.hub.namespace)
    refused_before = REFUSED._value.get()
    files = [f"{TOP}/f{i}" for i in range(workload.files)]
    setup = Principal("setup", site=HUB, protocol="test")
    await env.hub.namespace.mkdir(setup, TOP, exist_ok=True)
    for path in files:
        await env.hub.namespace.write_bytes(setup, path, b"initial")
    for name in workload.write_back:
        env.spokes[name].write_back = True
    sites = [HUB, *env.spokes]
    left = [workload.ops]
    done = asyncio.Event()
    # the calls under way at each spoke: a spoke that dies takes them with it
    calling: dict[str, set[asyncio.Task[None]]] = {site: set() for site in sites}
    restarting: dict[str, asyncio.Event] = {}

    def namespace(site: str) -> Namespace:
        return env.hub.namespace if site == HUB else env.spokes[site]

    async def client(name: str, site: str, crng: random.Random) -> None:
        who = Principal(name, site=HUB if site == HUB else "spoke", protocol="test")
        n = 0
        while left[0] > 0:
            left[0] -= 1
            n += 1
            await asyncio.sleep(crng.uniform(0, workload.think))
            if site in restarting:
                await restarting[site].wait()
            call = asyncio.create_task(one(name, site, who, crng, n))
            calling[site].add(call)
            with contextlib.suppress(asyncio.CancelledError):
                await call
            calling[site].discard(call)

    async def one(name: str, site: str, who: Principal, crng: random.Random, n: int) -> None:
        path = crng.choice(files)
        roll = crng.random()
        value = f"{name}-{n}"
        if roll < 0.4:
            await _read(history, namespace(site), who, name, site, path)
        elif roll < 0.7:
            await _write(history, namespace(site), who, name, site, path, value)
        elif roll < 0.9:
            version = await _version(namespace(site), who, path)
            if version:  # 0: its own write, not at the hub yet: nothing to name
                await _write(
                    history, namespace(site), who, name, site, path, value,
                    if_version=version,
                )  # fmt: skip
        else:
            fresh = f"{TOP}/new-{name}-{n}"
            await _write(
                history, namespace(site), who, name, site,
                fresh if crng.random() < 0.5 else path, value, exclusive=True,
            )  # fmt: skip

    async def restart(site: str) -> None:
        """Kill a spoke (its callers' calls go unanswered) or stop the hub (its own
        callers' calls finish first, as its requests do), and start it again."""
        restarting[site] = asyncio.Event()
        for call in list(calling[site]):
            if site != HUB:
                call.cancel()
        await asyncio.gather(*calling[site], return_exceptions=True)
        if site == HUB:
            await env.restart_hub()
            watch(env.hub.namespace)
        else:
            restarted = await env.restart_spoke(site)
            restarted.write_back = site in workload.write_back
        history.restarts += 1
        restarting.pop(site).set()

    async def faults() -> None:
        spokes = list(env.spokes)
        pause = 0.1  # the first fault comes early: a short run has one too
        while not done.is_set() and spokes:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await done.wait()
            pause = rng.expovariate(1 / workload.cut_every)
            if done.is_set():
                return
            site = rng.choice(spokes)
            began = time.monotonic()
            # the first fault of a run with restarts is one: a short run has one too
            if workload.restart_hub and (not history.restarts or rng.random() < 0.1):
                await restart(HUB)
                for spoke in spokes:  # the hub's death cuts every link
                    history.cuts.setdefault(spoke, []).append((began, time.monotonic()))
                continue
            if workload.restart_spokes and (not history.restarts or rng.random() < 0.15):
                await restart(site)
            else:
                env.links[site].cut()
                await asyncio.sleep(rng.uniform(0.05, workload.cut_for))
                env.links[site].restore()
            history.cuts.setdefault(site, []).append((began, time.monotonic()))

    clients = [
        client(f"{site}-c{i}", site, random.Random(rng.random()))
        for site in sites
        for i in range(workload.clients_per_site)
    ]
    faulting = asyncio.create_task(faults())
    try:
        await asyncio.gather(*clients)
    finally:
        done.set()
        await faulting
    for link in env.links.values():
        link.restore()
    for spoke in env.spokes.values():
        async with asyncio.timeout(120):
            with contextlib.suppress(Conflict):  # refusals, counted below
                await spoke.sync()
    history.refused_reported = int(REFUSED._value.get() - refused_before)
    for change in await env.hub.catalog.changes(0, 1 << 30):
        history.log.setdefault(change.path, []).append((change.seq, change.op, change.version))
    return history


async def _call(op: Op, history: History, call: Callable[[], Awaitable[Entry]]) -> None:
    history.ops.append(op)
    try:
        async with asyncio.timeout(OP_TIMEOUT):
            entry = await call()
    except asyncio.CancelledError:  # its spoke died under it
        op.outcome = "unanswered"
        raise
    except Exception as exc:
        op.outcome, op.error = _outcome(exc), repr(exc)
    else:
        op.outcome, op.version = "ok", entry.version
    finally:
        op.completed = time.monotonic()


def _outcome(exc: Exception) -> str:
    if isinstance(exc, (Conflict, AlreadyExists, NotFound)):
        return "refused"
    if isinstance(exc, (LoomError, TimeoutError)):  # unreachable, a hub shutting down...
        return "unanswered"  # it may or may not have happened
    return "failed"


async def _write(
    history: History,
    ns: Namespace,
    who: Principal,
    client: str,
    site: str,
    path: str,
    value: str,
    *,
    if_version: int | None = None,
    exclusive: bool = False,
) -> None:
    kind = "cas" if if_version is not None else "create" if exclusive else "write"
    op = Op(client, site, kind, path, time.monotonic(), value=value, if_version=if_version)
    await _call(
        op,
        history,
        lambda: ns.write_bytes(
            who, path, value.encode(), if_version=if_version, exclusive=exclusive
        ),
    )


async def _read(
    history: History, ns: Namespace, who: Principal, client: str, site: str, path: str
) -> None:
    op = Op(client, site, "read", path, time.monotonic())

    async def read() -> Entry:
        async with await ns.read(who, path) as reader:
            op.value = (await reader.read_all()).decode(errors="replace")
            return reader.entry

    await _call(op, history, read)


async def _version(ns: Namespace, who: Principal, path: str) -> int | None:
    """The version a client bases a conditional write on: what it can stat now."""
    try:
        async with asyncio.timeout(OP_TIMEOUT):
            return (await ns.stat(who, path)).version
    except (LoomError, TimeoutError):
        return None


def check(history: History) -> list[str]:
    """Every violation of the contract the history shows (none: it holds)."""
    problems: list[str] = []
    commits = history.commits
    for value, places in commits.items():
        if value != "initial" and len(places) > 1:
            problems.append(f"duplicated: {value!r} landed {len(places)} times: {places}")
    unlanded_conditional = 0
    for op in history.ops:
        if op.outcome == "failed":
            problems.append(f"failed: {op}")
        elif op.kind == "read":
            problems.extend(_check_read(history, op))
        elif op.value is not None:
            landed = commits.get(op.value, [])
            problem, unlanded = _check_write(history, op, landed)
            unlanded_conditional += unlanded
            if problem:
                problems.append(problem)
    if unlanded_conditional > history.refused_reported:
        problems.append(
            f"lost: {unlanded_conditional} acknowledged conditional writes never landed, "
            f"{history.refused_reported} were reported refused"
        )
    return problems


def _check_write(history: History, op: Op, landed: list[tuple[str, int]]) -> tuple[str, int]:
    """A problem with one write (or ''), and 1 for an acknowledged conditional write that
    did not land (allowed only as a reported refusal)."""
    conditional = op.kind in ("cas", "create")
    at_path = [(p, v) for p, v in landed if p == op.path]
    copies = [(p, v) for p, v in landed if p.startswith(op.path + ".conflict-")]
    if op.outcome == "refused" and landed:
        return f"refused yet landed: {op} at {landed}", 0
    if conditional and copies:
        return f"precondition bypassed (kept as a copy): {op} at {copies}", 0
    for _, version in at_path if conditional else ():
        before = _predecessor(history, op.path, version)
        expected = None if op.kind == "create" else op.if_version
        if before != expected:
            return (
                f"precondition bypassed: {op} committed as version {version} over "
                f"{before}, not {expected}",
                0,
            )
    if op.outcome != "ok":
        return "", 0
    if op.version:  # acknowledged as committed: exactly there
        if at_path != [(op.path, op.version)]:
            return f"lost: {op} acknowledged as version {op.version}, landed {landed}", 0
        return "", 0
    if not at_path and not copies:  # acknowledged before the hub checked it
        if conditional:
            return "", 1
        return f"lost: acknowledged {op}, never landed", 0
    return "", 0


def _predecessor(history: History, path: str, version: int) -> int | None:
    """The version ``path`` had just before the change that made ``version`` (None: it
    did not exist)."""
    before: int | None = None
    for seq, change, made in history.log.get(path, []):
        if seq >= version:
            break
        if change in (ChangeOp.CREATE, ChangeOp.MODIFY):
            before = made
        elif change in (ChangeOp.DELETE, ChangeOp.RENAME):
            before = None
    return before


def _check_read(history: History, op: Op) -> list[str]:
    if op.outcome != "ok" or op.value is None or op.version is None:
        # (a Conflict says the file changed while it was read: retry, nothing stale)
        if op.error.startswith("NotFound(") and _link_up(history, op):
            return [f"stale: {op} found nothing, with the link up"]
        return []
    problems = []
    if op.version == 0:  # a write not yet at the hub: only its writer's own
        if not op.value.startswith(op.client + "-"):
            problems.append(f"dirty: {op} read another client's write not at the hub")
        return problems
    if (op.path, op.version) not in history.commits.get(op.value, []):
        problems.append(f"dirty: {op} read a value the hub never committed as that version")
    if _link_up(history, op):
        newest = max(
            (
                w.version
                for w in history.ops
                if w.kind != "read"
                and w.path == op.path
                and w.outcome == "ok"
                and w.version
                and w.completed < op.invoked
            ),
            default=0,
        )
        if op.version < newest:
            problems.append(f"stale: {op} returned version {op.version}, {newest} was acknowledged")
    return problems


def _link_up(history: History, op: Op) -> bool:
    """Whether the link of the read's site stayed up from its start to its end."""
    return all(
        end < op.invoked or began > op.completed for began, end in history.cuts.get(op.site, [])
    )
