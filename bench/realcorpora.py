"""Real corpora for bench/transfer.py: two releases of software nobody here made (bench layer).

Issue 18. Each corpus is a pair of releases of a published package, downloaded by the bench
itself through the ordinary clients (``pip download``, ``npm pack``) into a cache directory
outside the repository (never committed), then unpacked side by side under the bench's
corpora root as ``<name>/v1`` and ``<name>/v2``, each file with its archive's mtime, so
an unchanged file keeps its content and may get a new mtime, as real upgrades leave them:

- 6 ``wheel``: an unpacked binary wheel (compiled ``.so`` files) of two releases;
- 7 ``npm``: an unpacked npm tarball of a mostly-text package;
- 8 ``source``: an unpacked source distribution (the package's source tree) of two tags.

``--quick`` picks small pairs (seconds); the full pairs change tens of percent of the files.
"""

from __future__ import annotations

import calendar
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path

from corpora import Corpus

CACHE = Path(os.environ.get("LOOMFS_BENCH_CACHE", Path.home() / ".cache" / "loomfs-bench"))
# One fixed wheel tag, so a run picks the same files whatever interpreter runs the bench.
WHEEL_TAG = ["--python-version", "3.11", "--platform", "manylinux2014_x86_64"]


@dataclass(frozen=True)
class Pair:
    number: int
    name: str
    kind: str  # "wheel", "npm" or "sdist"
    quick: tuple[str, str, str]  # package, older release, newer release
    full: tuple[str, str, str]


PAIRS = [
    Pair(6, "wheel", "wheel", ("pyyaml", "6.0.1", "6.0.2"), ("numpy", "1.26.4", "2.0.2")),
    Pair(7, "npm", "npm", ("lodash", "4.17.20", "4.17.21"), ("typescript", "5.3.3", "5.4.5")),
    Pair(8, "source", "sdist", ("requests", "2.31.0", "2.32.3"), ("pip", "23.3.2", "24.0")),
]


def download(pair: Pair, package: str, version: str) -> Path:
    """The release's archive in the cache, downloaded once."""
    where = CACHE / pair.kind / f"{package}-{version}"
    if where.is_dir() and any(where.iterdir()):
        return next(where.iterdir())
    where.mkdir(parents=True, exist_ok=True)
    if pair.kind == "npm":
        command = ["npm", "pack", "--silent", f"{package}@{version}"]
    else:
        wheel = pair.kind == "wheel"
        binary = ["--only-binary=:all:", *WHEEL_TAG] if wheel else ["--no-binary=:all:"]
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *binary]
        command += ["-d", str(where), f"{package}=={version}"]
    done = subprocess.run(
        command, check=False, cwd=where, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0 or not any(where.iterdir()):
        shutil.rmtree(where)
        raise RuntimeError(
            f"could not download {package} {version} ({' '.join(command)}): {done.stderr[-2000:]}"
            "\ninstall pip/npm and make PyPI and the npm registry reachable"
        )
    return next(where.iterdir())


def unpack(archive: Path, into: Path) -> None:
    """Unpack ``archive`` into ``into``, each file with its archive mtime."""
    into.mkdir(parents=True)
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zipped:
            for info in zipped.infolist():
                if info.is_dir():
                    continue
                target = Path(zipped.extract(info, into))
                stamp = calendar.timegm((*info.date_time, 0, 0, 0))
                os.utime(target, (stamp, stamp))
        return
    with tarfile.open(archive) as tarred:
        members = [m for m in tarred.getmembers() if m.isfile()]
        tarred.extractall(into, members=members, filter="data")
    # An archive's single top directory carries its version in its name: strip it, so
    # both releases hold their files at the same paths.
    tops = list(into.iterdir())
    if len(tops) == 1 and tops[0].is_dir():
        for item in tops[0].iterdir():
            item.rename(into / item.name)
        tops[0].rmdir()


def build_real(root: Path, quick: bool, numbers: Container[int]) -> list[Corpus]:
    """The real corpora ``numbers`` (of 6, 7, 8) unpacked under ``root``."""
    corpora = []
    for pair in PAIRS:
        if pair.number not in numbers:
            continue
        package, *versions = pair.quick if quick else pair.full
        top = root / pair.name
        if top.exists():
            shutil.rmtree(top)
        steps = []
        for index, version in enumerate(versions, start=1):
            unpack(download(pair, package, version), top / f"v{index}")
            steps.append(top / f"v{index}")
        title = f"{package} {versions[0]}->{versions[1]} ({pair.kind}, real)"
        corpora.append(Corpus(pair.number, pair.name, title, steps, renamed=False, restamped=True))
    return corpora
