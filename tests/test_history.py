"""The consistency contract, checked on recorded histories (``loomfs.testing.history``):
clients at a hub and two spokes (one acknowledging writes once journaled), unique values
with and without preconditions, links cut at random, spokes and the hub restarted.

Bounded for ``make test``; longer runs with ``LOOMFS_HISTORY_OPS`` (calls per run) and
``LOOMFS_HISTORY_RUNS`` (runs, each with its own seed); ``LOOMFS_HISTORY_SEED`` replays one.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from loomfs.core.types import ChangeOp
from loomfs.testing.fabric import fabric
from loomfs.testing.history import History, Op, Workload, check, run

OPS = int(os.environ.get("LOOMFS_HISTORY_OPS", "150"))
RUNS = int(os.environ.get("LOOMFS_HISTORY_RUNS", "1"))
SEEDS = (
    [int(os.environ["LOOMFS_HISTORY_SEED"])]
    if "LOOMFS_HISTORY_SEED" in os.environ
    else [random.randrange(1 << 32) for _ in range(RUNS)]
)
LEASE = 2.0


async def checked(tmp_path: Path, seed: int, workload: Workload) -> History:
    async with fabric(tmp_path, ("east", "west"), lease_ttl=LEASE) as env:
        history = await run(env, workload, seed)
    problems = check(history)
    assert not problems, f"seed {seed}: " + "\n".join(problems[:20])
    return history


@pytest.mark.parametrize("seed", SEEDS)
async def test_histories_under_link_cuts_hold_the_contract(tmp_path: Path, seed: int) -> None:
    history = await checked(tmp_path, seed, Workload(ops=OPS, write_back=frozenset({"east"})))
    outcomes = {op.outcome for op in history.ops}
    assert "ok" in outcomes and history.cuts  # it wrote, read, and was cut


@pytest.mark.parametrize("seed", SEEDS)
async def test_histories_across_restarts_hold_the_contract(tmp_path: Path, seed: int) -> None:
    workload = Workload(
        ops=OPS // 2,
        write_back=frozenset({"east"}),
        restart_spokes=True,
        restart_hub=True,
        cut_every=0.2,
    )
    history = await checked(tmp_path, seed, workload)
    assert history.restarts


# -- the checker itself finds each kind of violation ---------------------------------------


def base() -> History:
    """/f: made at 1 (initial), then 2 by a's write, acknowledged."""
    history = History()
    history.commits = {"initial": [("/f", 1)], "a-1": [("/f", 2)]}
    history.log = {"/f": [(1, ChangeOp.CREATE, 1), (2, ChangeOp.MODIFY, 2)]}
    history.ops = [Op("a", "east", "write", "/f", 0.0, "a-1", None, 1.0, "ok", 2)]
    return history


def test_the_checker_passes_a_good_history_and_flags_each_violation() -> None:
    assert check(base()) == []

    def flagged(change: object) -> str:
        history = base()
        assert callable(change)
        change(history)
        problems = check(history)
        assert len(problems) == 1, problems
        return problems[0].split(":")[0]

    assert flagged(lambda h: h.commits["a-1"].append(("/f.conflict-x", 3))) == "duplicated"
    assert flagged(lambda h: h.commits.pop("a-1")) == "lost"
    lost_early = Op("b", "east", "write", "/f", 0.0, "b-1", None, 1.0, "ok", 0)
    assert flagged(lambda h: h.ops.append(lost_early)) == "lost"
    cas = Op("b", "west", "cas", "/f", 2.0, "b-1", 1, 3.0, "ok", 0)  # named 1, landed on 2

    def bypass(h: History) -> None:
        h.ops.append(cas)
        h.commits["b-1"] = [("/f", 3)]
        h.log["/f"].append((3, ChangeOp.MODIFY, 3))

    assert flagged(bypass) == "precondition bypassed"
    refused = Op("b", "west", "write", "/f", 2.0, "b-1", None, 3.0, "refused")
    assert flagged(lambda h: (h.ops.append(refused), h.commits.update({"b-1": [("/f", 3)]}))) == (
        "refused yet landed"
    )
    dirty = Op("b", "west", "read", "/f", 2.0, "c-9", None, 3.0, "ok", 0)
    assert flagged(lambda h: h.ops.append(dirty)) == "dirty"
    stale = Op("b", "west", "read", "/f", 2.0, "initial", None, 3.0, "ok", 1)
    assert flagged(lambda h: h.ops.append(stale)) == "stale"
    # the same read with west's link cut meanwhile is allowed (served from its cache)
    history = base()
    history.ops.append(stale)
    history.cuts["west"] = [(2.5, 4.0)]
    assert check(history) == []
    # an acknowledged conditional write that never landed is fine once reported refused
    history = base()
    history.ops.append(cas)
    assert check(history)[0].startswith("lost")
    history.refused_reported = 1
    assert check(history) == []
