"""Reproducible corpora for the transfer benchmark (bench layer, issue 6).

Each corpus is a series of directory snapshots ``<root>/<name>/step-NNN/``: the receiver
holds snapshot k-1 and must come to hold snapshot k. Everything is seeded, so two runs
write the same bytes. Files that do not change between snapshots are hard links, so disk
use stays near the size of the distinct data.

1. ``dataset``: JSONL and Parquet shards, v1 -> v2 with 10% of rows changed or inserted at
   random positions, some shards renamed or moved to another directory, new shards added.
2. ``finetune``: 10 checkpoints ``step-100.pt``... (4 with ``--quick``) of a model whose
   backbone is frozen while its head and low-rank adapters train (AdamW state included),
   each under a new name.
3. ``subsets``: two training runs, each reading 30% of a set of token shards, half of the
   second run's shards shared with the first.
4. ``fulltrain``: 10 (or 4) checkpoints of a model where every weight trains.
5. ``random``: incompressible bytes standing in for JPEG or video.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn


@dataclass(frozen=True)
class Corpus:
    number: int
    name: str
    title: str
    steps: list[Path]
    renamed: bool  # files change names between snapshots: rsync gets --fuzzy
    # an upgrade rewrites every file (new mtime, often the same bytes): the hub gets each
    # file whose content or mtime changed, as rsync -a sees them, not only new content
    restamped: bool = False


@dataclass(frozen=True)
class Scale:
    """Sizes for one run: ``quick`` is seconds for CI, ``full`` is the measured benchmark."""

    jsonl_shards: int
    jsonl_rows: int
    parquet_shards: int
    parquet_rows: int
    finetune_width: int
    fulltrain_width: int
    token_shards: int
    token_shard_bytes: int
    random_files: int
    random_file_bytes: int
    checkpoints: int


QUICK = Scale(4, 4_000, 2, 3_000, 256, 128, 20, 200_000, 4, 1 << 20, 4)
FULL = Scale(16, 22_000, 8, 20_000, 1024, 512, 40, 5_000_000, 10, 10 << 20, 10)


def step_dir(corpus_root: Path, step: int) -> Path:
    path = corpus_root / f"step-{step:03d}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def link_into(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    os.link(source, target)


# --- 1. dataset v1 -> v2 ------------------------------------------------------------------


class RowMaker:
    """JSONL-like training rows: Zipf-distributed pseudo-words, so text compresses like
    natural text (about 3x with zstd) without repeating itself."""

    def __init__(self, rng: random.Random) -> None:
        letters = "etaoinshrdlucmfwypvbgkjqxz"
        self.rng = rng
        self.words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(20_000)]
        self.weights = list(accumulate(1 / (rank + 1) ** 1.1 for rank in range(len(self.words))))
        self.next_id = 0

    def row(self) -> dict[str, object]:
        self.next_id += 1
        text = " ".join(
            self.rng.choices(self.words, cum_weights=self.weights, k=self.rng.randint(20, 120))
        )
        return {
            "id": self.next_id,
            "source": self.rng.choice(["web", "books", "code", "wiki"]),
            "text": text,
            "score": round(self.rng.random(), 4),
        }

    def rows(self, count: int) -> list[dict[str, object]]:
        return [self.row() for _ in range(count)]

    def edit(self, rows: list[dict[str, object]], fraction: float) -> list[dict[str, object]]:
        """Change half of ``fraction`` of the rows in place and insert as many new rows at
        random positions."""
        edited = list(rows)
        touched = max(1, int(len(rows) * fraction / 2))
        for index in self.rng.sample(range(len(edited)), touched):
            edited[index] = {**self.row(), "id": edited[index]["id"]}
        for _ in range(touched):
            edited.insert(self.rng.randrange(len(edited) + 1), self.row())
        return edited


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)


def write_parquet(path: Path, rows: list[dict[str, object]]) -> None:
    # pyarrow's default codec (snappy), as most published Parquet datasets use.
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, compression="snappy")


def dataset(root: Path, scale: Scale, seed: int) -> list[Path]:
    maker = RowMaker(random.Random(seed))
    v1, v2 = step_dir(root, 0), step_dir(root, 1)
    shards: list[tuple[str, int, Callable[[Path, list[dict[str, object]]], None]]] = [
        *(
            (f"jsonl/train-{i:05d}.jsonl", scale.jsonl_rows, write_jsonl)
            for i in range(scale.jsonl_shards)
        ),
        *(
            (f"parquet/train-{i:05d}.parquet", scale.parquet_rows, write_parquet)
            for i in range(scale.parquet_shards)
        ),
    ]
    # Shards 1 and 2 of JSONL are renamed in place, 3 is moved to another directory; all
    # three keep their content. Every other shard gets 10% of its rows changed or inserted.
    moves = {
        "jsonl/train-00001.jsonl": "jsonl/train-00001-dedup.jsonl",
        "jsonl/train-00002.jsonl": "jsonl/train-00002-dedup.jsonl",
        "jsonl/train-00003.jsonl": "archive/train-00003.jsonl",
    }
    for name, count, write in shards:
        rows = maker.rows(count)
        write(v1 / name, rows)
        if name in moves:
            link_into(v1 / name, v2 / moves[name])
        else:
            write(v2 / name, maker.edit(rows, 0.10))
    for i in range(scale.jsonl_shards, scale.jsonl_shards + 2):
        write_jsonl(v2 / f"jsonl/train-{i:05d}.jsonl", maker.rows(scale.jsonl_rows))
    write_parquet(
        v2 / f"parquet/train-{scale.parquet_shards:05d}.parquet", maker.rows(scale.parquet_rows)
    )
    return [v1, v2]


# --- 2. and 4. checkpoint series -----------------------------------------------------------


class Adapter(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (LoRA-style)."""

    def __init__(self, width: int, rank: int, trainable_base: bool) -> None:
        super().__init__()
        self.base = nn.Linear(width, width)
        self.base.requires_grad_(trainable_base)
        self.down = nn.Linear(width, rank, bias=False)
        self.up = nn.Linear(rank, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.base(x) + self.up(self.down(x)))


def checkpoints(root: Path, width: int, count: int, seed: int, frozen_backbone: bool) -> list[Path]:
    """``count`` checkpoints, 20 AdamW steps apart, each a new file in a growing directory."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        *(Adapter(width, 8, trainable_base=not frozen_backbone) for _ in range(6)),
        nn.Linear(width, 512),
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    steps: list[Path] = []
    for index in range(count):
        for _ in range(20):
            inputs = torch.randn(16, width)
            targets = torch.randint(0, 512, (16,))
            loss = nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            optimizer.step()
        snapshot = step_dir(root, index)
        if index:
            for old in steps[-1].iterdir():
                link_into(old, snapshot / old.name)
        name = f"step-{(index + 1) * 100}.pt"
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": index},
            snapshot / name,
        )
        steps.append(snapshot)
    return steps


# --- 3. two runs reading overlapping subsets -------------------------------------------


def subsets(root: Path, scale: Scale, seed: int) -> list[Path]:
    """Token shards (uint16, Zipf-like ids); run A reads 30% of them, run B another 30%
    of which half is run A's. Run B's snapshot holds only what run B reads."""
    rng = np.random.default_rng(seed)
    source = root / "all"
    names = [f"tokens-{i:05d}.bin" for i in range(scale.token_shards)]
    source.mkdir(parents=True, exist_ok=True)
    for name in names:
        tokens = np.minimum(rng.zipf(1.2, scale.token_shard_bytes // 2), 50_000)
        (source / name).write_bytes(tokens.astype(np.uint16).tobytes())
    picked = int(len(names) * 0.3)
    order = [str(name) for name in rng.permutation(names)]
    run_a = order[:picked]
    run_b = run_a[: picked // 2] + order[picked : picked + picked - picked // 2]
    steps = []
    for index, run in enumerate((run_a, run_b)):
        snapshot = step_dir(root, index)
        for name in run:
            link_into(source / name, snapshot / name)
        steps.append(snapshot)
    return steps


# --- 5. incompressible ---------------------------------------------------------------------


def random_bytes(root: Path, scale: Scale, seed: int) -> list[Path]:
    rng = np.random.default_rng(seed)
    snapshot = step_dir(root, 0)
    for i in range(scale.random_files):
        (snapshot / f"video-{i:03d}.bin").write_bytes(rng.bytes(scale.random_file_bytes))
    return [snapshot]


def build(
    root: Path, quick: bool, seed: int = 6, numbers: Container[int] = range(1, 6)
) -> list[Corpus]:
    """Write the corpora ``numbers`` (all five by default) under ``root`` (emptied first)
    and describe them. Each is seeded on its own, so a subset holds the same bytes."""
    scale = QUICK if quick else FULL
    if root.exists():
        shutil.rmtree(root)
    torch.set_num_threads(2)
    makers: list[tuple[int, str, str, Callable[[Path], list[Path]], bool]] = [
        (1, "dataset", "dataset v1->v2 (JSONL+Parquet)", lambda r: dataset(r, scale, seed), True),
        (
            2,
            "finetune",
            "fine-tuning checkpoints",
            lambda r: checkpoints(r, scale.finetune_width, scale.checkpoints, seed, True),
            True,
        ),
        (
            3,
            "subsets",
            "two runs, 30% subsets, 50% overlap",
            lambda r: subsets(r, scale, seed),
            False,
        ),
        (
            4,
            "fulltrain",
            "full-training checkpoints",
            lambda r: checkpoints(r, scale.fulltrain_width, scale.checkpoints, seed, False),
            True,
        ),
        (5, "random", "incompressible bytes", lambda r: random_bytes(r, scale, seed), False),
    ]
    return [
        Corpus(number, name, title, make(root / name), renamed)
        for number, name, title, make, renamed in makers
        if number in numbers
    ]


def files_of(snapshot: Path) -> Iterator[Path]:
    """The regular files of a snapshot, in a stable order."""
    return iter(sorted(path for path in snapshot.rglob("*") if path.is_file()))
