"""Bytes that must cross the link per corpus: loomfs vs rsync vs restic vs a plain copy.

Bench layer, issue 6. For each corpus of ``corpora.py`` the receiver holds snapshot k-1
and must come to hold snapshot k; every tool is run side by side on the same snapshots:

- loomfs: a hub and a spoke over the emulated fabric link (``LinkEmulator``, mutual TLS);
  the spoke fetches each snapshot's new file versions (chunk maps, then only the chunks it
  holds in no cached file, zstd or delta-encoded, verified on receipt); the bytes are
  counted at the link emulator, both directions, TLS and HTTP included.
- rsync: ``rsync -az --stats --delete-after`` (plus ``--fuzzy`` where files are renamed)
  pulling from a real rsync daemon on a free loopback port; bytes sent + received.
- restic: ``restic backup`` of each snapshot into one local repository; growth of the
  repository's size.
- plain copy: the bytes of files that are new or changed at their path.

Corpora 6-8 (``realcorpora.py``) are pairs of real releases (a wheel with ``.so`` files,
an npm package, a source tree), downloaded by the bench into a cache outside the repository.
After each step the spoke's copy is read back and compared byte for byte.

Run: ``PYTHONPATH=src python bench/transfer.py [--quick] [--json PATH] [--rate MB/s]
[--corpora 1,5]``; real data only: ``--corpora 6,7,8``.
"""

from __future__ import annotations

import argparse
import asyncio
import filecmp
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from corpora import Corpus, build, files_of
from loomfs.chunks.pipeline import ChunkPipeline
from loomfs.core.types import SYSTEM, Principal
from loomfs.testing.fabric import Fabric, fabric
from loomfs.testing.ports import free_port, stop_process, wait_for_port
from realcorpora import build_real

WHO = Principal(user="bench")


@dataclass
class StepResult:
    step: int
    snapshot_size: int = 0
    copy: int = 0
    rsync: int = 0
    restic: int = 0
    loomfs: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


# --- loomfs --------------------------------------------------------------------------------


class LoomfsLink:
    """A loomfs hub and spoke (in-process, mutual TLS) over the emulated link. Each
    snapshot is written into the hub's volume through its namespace (not counted), then
    the spoke warms the corpus's directory: it fetches every file version it lacks, as
    chunk maps and the chunks it holds nowhere. The bytes loomfs moved are those that
    crossed the link emulator, both ways; then a plain ranged HTTP read of the changed
    files through the same link gives the time of a plain copy over it."""

    def __init__(self, env: Fabric, corpus: str) -> None:
        self.env = env
        self.top = f"/vol/{corpus}"
        self.names: set[str] = set()

    async def step(self, snapshot: Path, changed: list[Path], result: StepResult) -> None:
        hub = self.env.hub.namespace
        now = {path.relative_to(snapshot).as_posix() for path in files_of(snapshot)}
        for name in sorted(self.names - now):
            await hub.remove(SYSTEM, f"{self.top}/{name}")
        for path in changed:
            target = f"{self.top}/{path.relative_to(snapshot).as_posix()}"
            await hub.mkdir(SYSTEM, target.rsplit("/", 1)[0], parents=True, exist_ok=True)
            await hub.write(SYSTEM, target, _stream(path))
        self.names = now
        link = self.env.link
        before = link.down.bytes + link.up.bytes
        started = time.perf_counter()
        await self.env.spoke.warm(WHO, self.top)
        result.seconds["loomfs"] = time.perf_counter() - started
        result.loomfs = link.down.bytes + link.up.bytes - before
        await self.verify(snapshot)
        started = time.perf_counter()
        plain = self.env.client(self.env.first)
        try:
            for path in changed:
                name = f"{self.top}/{path.relative_to(snapshot).as_posix()}"
                async with await plain.read(SYSTEM, name) as reader:
                    async for _ in reader.chunks():
                        pass
        finally:
            await plain.close()
        result.seconds["link copy"] = time.perf_counter() - started

    async def verify(self, snapshot: Path) -> None:
        """The spoke's copy of the snapshot, byte for byte (after the bytes are counted)."""
        for path in files_of(snapshot):
            name = f"{self.top}/{path.relative_to(snapshot).as_posix()}"
            held = bytearray()
            async with await self.env.spoke.read(WHO, name) as reader:
                async for data in reader.chunks():
                    held += data
            if held != path.read_bytes():
                raise RuntimeError(f"the spoke's {name} differs from {path}")


async def _stream(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as source:
        while data := await asyncio.to_thread(source.read, 1 << 20):
            yield data


async def loomfs_corpus(
    corpus: Corpus, results: list[StepResult], work: Path, rate: float | None, rtt: float
) -> None:
    where = work / f"loomfs-{corpus.name}"
    where.mkdir()
    async with fabric(where, capacity=8 << 30, rate=rate, latency=rtt / 2) as env:
        await env.hub.namespace.mkdir(SYSTEM, f"/vol/{corpus.name}")
        link = LoomfsLink(env, corpus.name)
        for snapshot, result in zip(corpus.steps, results, strict=True):
            previous = corpus.steps[result.step - 1] if result.step else None
            changed = changed_files(snapshot, previous, restamped=corpus.restamped)
            await link.step(snapshot, changed, result)


def map_rate(pipeline: ChunkPipeline, files: list[Path], result: StepResult) -> None:
    """The chunking pipeline alone (cut + BLAKE3 on 2 threads), as the hub runs it."""
    started = time.perf_counter()
    for path in files:
        pipeline.map_file(path)
    result.seconds["loomfs_map"] = time.perf_counter() - started


# --- rsync ---------------------------------------------------------------------------------


@contextmanager
def rsync_daemon(root: Path, workdir: Path) -> Iterator[str]:
    """An rsync daemon serving ``root`` as module ``corpora`` on a free loopback port;
    yields the module URL and stops the daemon by its pid."""
    config = workdir / "rsyncd.conf"
    config.write_text(
        f"use chroot = no\nuid = root\ngid = root\n[corpora]\npath = {root}\nread only = yes\n"
    )
    port = free_port()
    daemon = subprocess.Popen(
        [
            "rsync",
            "--daemon",
            "--no-detach",
            "--address=127.0.0.1",
            f"--port={port}",
            f"--config={config}",
            f"--log-file={workdir / 'rsyncd.log'}",
        ],
        start_new_session=True,  # its own process group: stop_process signals only it
    )
    try:
        wait_for_port(port, proc=daemon)
        yield f"rsync://127.0.0.1:{port}/corpora"
    finally:
        stop_process(daemon)


def rsync_step(url: str, snapshot: Path, root: Path, dest: Path, fuzzy: bool) -> int:
    source = f"{url}/{snapshot.relative_to(root).as_posix()}/"
    flags = ["-az", "--stats", "--delete-after", *(["--fuzzy"] if fuzzy else [])]
    out = subprocess.run(
        ["rsync", *flags, source, f"{dest}/"], check=True, capture_output=True, text=True
    ).stdout
    return rsync_stat(out, "sent") + rsync_stat(out, "received")


def rsync_stat(stats: str, what: str) -> int:
    found = re.search(rf"Total bytes {what}: ([\d,]+)", stats)
    if found is None:
        raise RuntimeError(f"rsync --stats printed no 'Total bytes {what}' line:\n{stats}")
    return int(found.group(1).replace(",", ""))


# --- restic --------------------------------------------------------------------------------


def tree_size(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


class ResticRepo:
    def __init__(self, repo: Path) -> None:
        self.env = {**os.environ, "RESTIC_PASSWORD": "loomfs-bench", "RESTIC_REPOSITORY": str(repo)}
        self.repo = repo
        self._restic("init", "--repository-version", "2")

    def _restic(self, *args: str) -> None:
        subprocess.run(
            ["restic", "--no-cache", "--quiet", *args],
            env=self.env,
            check=True,
            capture_output=True,
            timeout=900,
        )

    def backup(self, snapshot: Path) -> int:
        """Back ``snapshot`` up; return how much the repository grew."""
        before = tree_size(self.repo)
        self._restic("backup", "--host", "bench", str(snapshot))
        return tree_size(self.repo) - before


# --- plain copy ----------------------------------------------------------------------------


def changed_files(snapshot: Path, previous: Path | None, *, restamped: bool = False) -> list[Path]:
    """Files of ``snapshot`` that are new or differ from the file at the same path before;
    ``restamped``: also those of the same bytes and another mtime (written again)."""
    changed = []
    for path in files_of(snapshot):
        old = previous / path.relative_to(snapshot) if previous else None
        if old is None or not old.is_file() or _differs(old, path, restamped):
            changed.append(path)
    return changed


def _differs(old: Path, new: Path, restamped: bool) -> bool:
    if restamped and old.stat().st_mtime_ns != new.stat().st_mtime_ns:
        return True
    return not filecmp.cmp(old, new, shallow=False)


def copy_step(files: list[Path], scratch: Path) -> int:
    scratch.mkdir(parents=True, exist_ok=True)
    for index, path in enumerate(files):
        shutil.copyfile(path, scratch / str(index))
    shutil.rmtree(scratch)
    return sum(path.stat().st_size for path in files)


# --- the run -------------------------------------------------------------------------------


@contextmanager
def timed(result: StepResult, tool: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    result.seconds[tool] = result.seconds.get(tool, 0) + time.perf_counter() - started


def run_corpus(
    corpus: Corpus,
    root: Path,
    url: str,
    restic: ResticRepo,
    work: Path,
    link: tuple[float | None, float],
) -> list[StepResult]:
    dest = work / f"rsync-{corpus.name}"
    dest.mkdir()
    results = []
    with ChunkPipeline(workers=2) as pipeline:
        previous: Path | None = None
        for step, snapshot in enumerate(corpus.steps):
            result = StepResult(step, snapshot_size=tree_size(snapshot))
            changed = changed_files(snapshot, previous)
            with timed(result, "copy"):
                result.copy = copy_step(changed, work / "copy")
            with timed(result, "rsync"):
                result.rsync = rsync_step(url, snapshot, root, dest, corpus.renamed)
            with timed(result, "restic"):
                result.restic = restic.backup(snapshot)
            map_rate(pipeline, changed, result)
            results.append(result)
            previous = snapshot
    asyncio.run(loomfs_corpus(corpus, results, work, *link))
    return results


@dataclass
class Row:
    corpus: Corpus
    phase: str
    steps: list[StepResult]

    def total(self, tool: str) -> int:
        return sum(int(getattr(step, tool)) for step in self.steps)

    def seconds(self, tool: str) -> float:
        return sum(step.seconds.get(tool, 0.0) for step in self.steps)


def rows_of(corpus: Corpus, results: list[StepResult]) -> list[Row]:
    rows = [Row(corpus, "initial", results[:1])]
    if len(results) > 1:
        rows.append(Row(corpus, f"{len(results) - 1} update(s)", results[1:]))
    return rows


def mb(value: float) -> str:
    return f"{value / 1e6:,.2f}"


def table(rows: list[Row]) -> str:
    head = (
        "| corpus | phase | copy MB | rsync MB | restic MB | loomfs MB "
        "| loomfs/rsync | loomfs/best(rsync,restic) | loomfs/copy | loomfs map MB/s "
        "| wall s: copy / rsync / restic / loomfs / link copy |"
    )
    lines = [head, "|" + "---|" * 11]
    for row in rows:
        loom, rsync, restic = row.total("loomfs"), row.total("rsync"), row.total("restic")
        best = min(rsync, restic)
        map_s = row.seconds("loomfs_map")
        tools = ("copy", "rsync", "restic", "loomfs", "link copy")
        walls = " / ".join(f"{row.seconds(t):.2f}" for t in tools)
        lines.append(
            f"| {row.corpus.number}. {row.corpus.title} | {row.phase} "
            f"| {mb(row.total('copy'))} | {mb(rsync)} | {mb(restic)} | {mb(loom)} "
            f"| {loom / max(rsync, 1):.2f} | {loom / max(best, 1):.2f} "
            f"| {loom / max(row.total('copy'), 1):.2f} "
            f"| {row.total('copy') / max(map_s, 1e-9) / 1e6:,.0f} | {walls} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small corpora, seconds not minutes")
    parser.add_argument("--json", type=Path, help="write every step's numbers here")
    parser.add_argument("--workdir", type=Path, help="where corpora go (default: a temp dir)")
    parser.add_argument("--rate", type=float, help="link rate for loomfs, MB/s (default: unshaped)")
    parser.add_argument("--rtt", type=float, default=2.0, help="link round trip, ms")
    parser.add_argument(
        "--corpora",
        default="1,2,3,4,5",
        help="which corpora to build and run, by number (6-8: real releases, see realcorpora.py)",
    )
    args = parser.parse_args()
    link = (args.rate * 1e6 if args.rate else None, args.rtt / 1000)
    with tempfile.TemporaryDirectory(prefix="loomfs-bench-", dir=args.workdir) as tmp:
        work = Path(tmp)
        root = work / "corpora"
        started = time.perf_counter()
        picked = {int(n) for n in args.corpora.split(",")}
        corpora = build(root, quick=args.quick, numbers=picked)
        corpora += build_real(root, quick=args.quick, numbers=picked)
        print(f"corpora written in {time.perf_counter() - started:.1f}s under {root}")
        rows: list[Row] = []
        report = []
        # One restic repository for all corpora: its init costs seconds of key derivation,
        # and corpora share no content (distinct seeds and shapes), so growth stays per step.
        restic = ResticRepo(work / "restic")
        with rsync_daemon(root, work) as url:
            for corpus in corpora:
                results = run_corpus(corpus, root, url, restic, work, link)
                rows.extend(rows_of(corpus, results))
                report.append({"corpus": corpus.name, "steps": [asdict(r) for r in results]})
    print(
        "loomfs bytes crossed the emulated link (hub -> spoke and back, TLS included); link copy"
        " is a plain ranged read of the changed files over the same link"
    )
    rate = f"{args.rate} MB/s" if args.rate else "unshaped"
    print(f"run: {'quick' if args.quick else 'full'} corpora, {os.cpu_count()} cores, {rate}\n")
    print(table(rows))
    steps = [step for row in rows for step in row.steps]
    moved = sum(step.copy for step in steps)
    seconds = sum(step.seconds.get("loomfs_map", 0.0) for step in steps)
    print(
        f"\nloomfs cut + BLAKE3, 2 threads: {moved / seconds / 1e6:,.0f} MB/s over {mb(moved)} MB"
    )
    if args.json:
        args.json.write_text(json.dumps({"quick": args.quick, "corpora": report}, indent=2))


if __name__ == "__main__":
    main()
