"""Bytes that must cross the link per corpus: loomfs vs rsync vs restic vs a plain copy.

Bench layer, issue 6. For each corpus of ``corpora.py`` the receiver holds snapshot k-1
and must come to hold snapshot k; every tool is run side by side on the same snapshots:

- loomfs: chunk maps, the chunk ids the receiver asks for, and the frames of the chunks
  it lacks (zstd or delta against the version it holds), computed with the chunk library.
  The fabric link is not built yet, so these bytes are counted, not sent; every frame is
  decoded and verified against its id, as a receiver would.
- rsync: ``rsync -az --stats --delete-after`` (plus ``--fuzzy`` where files are renamed)
  pulling from a real rsync daemon on a free loopback port; bytes sent + received.
- restic: ``restic backup`` of each snapshot into one local repository; growth of the
  repository's size.
- plain copy: the bytes of files that are new or changed at their path.

Run: ``PYTHONPATH=src python bench/transfer.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO

from corpora import Corpus, build, files_of
from loomfs.chunks import (
    ChunkMap,
    ChunkPipeline,
    ChunkToSend,
    FileReference,
    FrameKind,
    choose_reference,
    decode_frame,
    plan_transfer,
)
from loomfs.chunks.chunkmap import ID_SIZE
from loomfs.testing.ports import free_port, stop_process, wait_for_port

# Per file, a real request also names the path and the version: count the path and 16
# bytes of version and size, the chunk map, and one id per requested chunk.
FILE_HEADER = 16
DELTA_KINDS = (FrameKind.DELTA, FrameKind.XOR)


@dataclass
class StepResult:
    step: int
    snapshot_size: int = 0
    copy: int = 0
    rsync: int = 0
    restic: int = 0
    loomfs: int = 0
    loomfs_maps: int = 0
    loomfs_delta_chunks: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


# --- loomfs --------------------------------------------------------------------------------


class LoomfsReceiver:
    """What the receiver holds (chunk ids and file versions) and what reaching each next
    snapshot costs on the wire, computed with the chunk library."""

    def __init__(self, pipeline: ChunkPipeline) -> None:
        self.pipeline = pipeline
        self.held_ids: set[bytes] = set()
        self.held_files: dict[str, tuple[ChunkMap, Path]] = {}

    def step(self, snapshot: Path, changed: list[Path], result: StepResult) -> None:
        """Bring the receiver to ``snapshot``; only ``changed`` files (new, or a new version
        at their path) cost anything: the hub keeps maps per version and the spoke knows
        which versions it holds."""
        versions = {name: held for name, (held, _) in self.held_files.items()}
        arrived: dict[str, tuple[ChunkMap, Path]] = {}
        for path in changed:
            name = path.relative_to(snapshot).as_posix()
            started = time.perf_counter()
            new = self.pipeline.map_file(path)
            mapped = time.perf_counter()
            base = choose_reference(name, new, versions)
            ref_map, ref_path = self.held_files[base] if base is not None else (None, None)
            plan = plan_transfer(new, self.held_ids, ref_map)
            with tempfile.TemporaryFile() as spool:
                # Frames are spooled to disk, not collected: a file's frames can be as large
                # as the file. The receiver's decoding runs after the clock stops.
                sizes = [
                    spool.write(frame) for frame in self.pipeline.encode_file(path, plan, ref_path)
                ]
                encoded = time.perf_counter()
                spool.seek(0)
                self._receive(spool, plan, sizes, ref_path, result)
            result.seconds["loomfs_map"] = result.seconds.get("loomfs_map", 0) + mapped - started
            result.seconds["loomfs"] = result.seconds.get("loomfs", 0) + encoded - started
            map_bytes = len(new.serialize()) + len(name.encode()) + FILE_HEADER
            result.loomfs_maps += map_bytes
            result.loomfs += map_bytes + ID_SIZE * len(plan) + sum(sizes)
            self.held_ids.update(send.entry.id for send in plan)
            arrived[name] = (new, path)
        self.held_files.update(arrived)

    @staticmethod
    def _receive(
        spool: BinaryIO,
        plan: list[ChunkToSend],
        sizes: list[int],
        reference: Path | None,
        result: StepResult,
    ) -> None:
        """Decode and verify every frame as the receiver would."""
        with FileReference(reference) if reference else nullcontext() as ref:
            for send, size in zip(plan, sizes, strict=True):
                frame = spool.read(size)
                result.loomfs_delta_chunks += frame[0] & 0x0F in DELTA_KINDS
                decode_frame(frame, send.entry.id, ref)


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


def changed_files(snapshot: Path, previous: Path | None) -> list[Path]:
    """Files of ``snapshot`` that are new or differ from the file at the same path before."""
    changed = []
    for path in files_of(snapshot):
        old = previous / path.relative_to(snapshot) if previous else None
        if old is None or not old.is_file() or not filecmp.cmp(old, path, shallow=False):
            changed.append(path)
    return changed


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
    corpus: Corpus, root: Path, url: str, restic: ResticRepo, work: Path
) -> list[StepResult]:
    dest = work / f"rsync-{corpus.name}"
    dest.mkdir()
    results = []
    with ChunkPipeline(workers=2) as pipeline:
        receiver = LoomfsReceiver(pipeline)
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
            receiver.step(snapshot, changed, result)
            results.append(result)
            previous = snapshot
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
        "| loomfs/rsync | loomfs/best(rsync,restic) | loomfs/copy | loomfs encode MB/s "
        "| wall s: copy / rsync / restic / loomfs |"
    )
    lines = [head, "|" + "---|" * 11]
    for row in rows:
        loom, rsync, restic = row.total("loomfs"), row.total("rsync"), row.total("restic")
        best = min(rsync, restic)
        encode_s = row.seconds("loomfs")
        walls = " / ".join(f"{row.seconds(t):.2f}" for t in ("copy", "rsync", "restic", "loomfs"))
        lines.append(
            f"| {row.corpus.number}. {row.corpus.title} | {row.phase} "
            f"| {mb(row.total('copy'))} | {mb(rsync)} | {mb(restic)} | {mb(loom)} "
            f"| {loom / max(rsync, 1):.2f} | {loom / max(best, 1):.2f} "
            f"| {loom / max(row.total('copy'), 1):.2f} "
            f"| {row.total('copy') / max(encode_s, 1e-9) / 1e6:,.0f} | {walls} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small corpora, seconds not minutes")
    parser.add_argument("--json", type=Path, help="write every step's numbers here")
    parser.add_argument("--workdir", type=Path, help="where corpora go (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loomfs-bench-", dir=args.workdir) as tmp:
        work = Path(tmp)
        root = work / "corpora"
        started = time.perf_counter()
        corpora = build(root, quick=args.quick)
        print(f"corpora written in {time.perf_counter() - started:.1f}s under {root}")
        rows: list[Row] = []
        report = []
        # One restic repository for all corpora: its init costs seconds of key derivation,
        # and corpora share no content (distinct seeds and shapes), so growth stays per step.
        restic = ResticRepo(work / "restic")
        with rsync_daemon(root, work) as url:
            for corpus in corpora:
                results = run_corpus(corpus, root, url, restic, work)
                rows.extend(rows_of(corpus, results))
                report.append({"corpus": corpus.name, "steps": [asdict(r) for r in results]})
    print(
        "loomfs bytes are computed with the chunk library (maps + requested ids + frames, each"
        " frame decoded and verified); the fabric link is not built yet, so nothing was sent."
    )
    print(f"run: {'quick' if args.quick else 'full'} corpora, {os.cpu_count()} cores\n")
    print(table(rows))
    steps = [step for row in rows for step in row.steps]
    moved = sum(step.copy for step in steps)
    for label, key in (("cut + BLAKE3", "loomfs_map"), ("cut + hash + plan + encode", "loomfs")):
        seconds = sum(step.seconds.get(key, 0.0) for step in steps)
        print(f"\nloomfs {label}, 2 threads: {moved / seconds / 1e6:,.0f} MB/s over {mb(moved)} MB")
    if args.json:
        args.json.write_text(json.dumps({"quick": args.quick, "corpora": report}, indent=2))


if __name__ == "__main__":
    main()
