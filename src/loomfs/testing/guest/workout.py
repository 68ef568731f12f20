"""Everyday file operations by a real kernel client, checked on the server's side (testing
layer).

``Workout`` puts its inputs in the guest's share, gives the guest a script that mounts an
export and works on it (``cp``, ``dd``, ``ls -l``, ``mv``, ``rm``, ``mkdir -p``, ``ln -s``,
``chmod``, ``touch -d``, a large file, many small ones), remounts it to read back past the
client's cache, and says what the exported tree must then hold. ``snapshot`` reads a
directory into the same shape, so a test compares the two; a server whose tree is not a
directory (loomfs) builds its ``Tree`` from its own API.
"""

from __future__ import annotations

import hashlib
import os
import random
import stat
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

#: ``touch -d`` in the guest (which runs in UTC) and the mtime it must give
STAMP = "2020-01-02 03:04:05"
STAMP_EPOCH = 1577934245


@dataclass(frozen=True)
class Node:
    """One entry of a tree; ``None`` in an expectation means "any"."""

    kind: str  # "dir", "file" or "link"
    sha256: str | None = None
    size: int | None = None
    mode: str | None = None  # octal, as "0o755"
    mtime: int | None = None
    target: str | None = None


#: a tree's contents by relative path
Tree = dict[str, Node]


def _file(data: bytes, mode: int | None = None, mtime: int | None = None) -> Node:
    digest = hashlib.sha256(data).hexdigest()
    return Node("file", digest, len(data), None if mode is None else oct(mode), mtime)


def snapshot(root: Path) -> Tree:
    """Every entry under ``root``, as a server's side sees it."""
    tree: Tree = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            info = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                tree[rel] = Node("link", target=os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                tree[rel] = Node("dir")
            else:
                tree[rel] = _file(path.read_bytes(), stat.S_IMODE(info.st_mode), int(info.st_mtime))
    return tree


class Workout:
    """One run's inputs and expectations. ``symlinks`` and ``modes`` are off for clients
    whose protocol has neither (SMB 3 without POSIX extensions)."""

    small_files = 100

    def __init__(
        self, *, seed: int = 0, big_mib: int = 16, symlinks: bool = True, modes: bool = True
    ) -> None:
        self.big = random.Random(seed).randbytes(big_mib << 20)
        self.symlinks = symlinks
        self.modes = modes

    def prepare(self, share: Path) -> None:
        """Write the inputs into the directory the guest sees at /host."""
        (share / "in").mkdir(parents=True, exist_ok=True)
        (share / "in/big.bin").write_bytes(self.big)
        (share / "out").mkdir(exist_ok=True)

    def script(self, mount: str, mountpoint: str = "/mnt") -> str:
        """The guest's script: ``mount`` is the shell command that mounts the export at
        ``mountpoint`` (``NfsExport.mount``, ``SmbShare.mount``)."""
        link = "ln -s data/big.bin link" if self.symlinks else ""
        modes = "chmod 755 script.sh; chmod 600 private.txt" if self.modes else ""
        return f"""set -eu
M={mountpoint}
mkdir -p $M
{mount}
cd $M
mkdir -p data deep/a/b/c
cp /host/in/big.bin data/big.bin
dd if=/host/in/big.bin of=data/dd.bin bs=64k
dd if=/dev/zero of=zeros.bin bs=1M count=4 conv=fsync
echo hello > moved.txt
mv moved.txt deep/a/b/c/moved.txt
echo bye > gone.txt
rm gone.txt
mkdir olddir
echo inside > olddir/inside.txt
mv olddir newdir
{link}
echo '#!/bin/sh' > script.sh
echo secret > private.txt
{modes}
echo stamp > stamped.txt
touch -d '{STAMP}' stamped.txt
mkdir small
i=0
while [ $i -lt {self.small_files} ]; do i=$((i + 1)); echo $i > small/$i; done
ls -l
cd /
umount $M
{mount}
cp $M/data/big.bin /host/out/big.bin
cat $M/deep/a/b/c/moved.txt
stat -c 'stat %n %a %Y' $M/script.sh $M/private.txt $M/stamped.txt
ls $M/small | wc -l
umount $M
echo WORKOUT-DONE
"""

    def expected(self) -> Tree:
        """What the export holds after the script."""
        dirs = ("data", "deep", "deep/a", "deep/a/b", "deep/a/b/c", "newdir", "small")
        tree: Tree = {name: Node("dir") for name in dirs}
        tree["data/big.bin"] = _file(self.big)
        tree["data/dd.bin"] = _file(self.big)
        tree["zeros.bin"] = _file(bytes(4 << 20))
        tree["deep/a/b/c/moved.txt"] = _file(b"hello\n")
        tree["newdir/inside.txt"] = _file(b"inside\n")
        tree["script.sh"] = _file(b"#!/bin/sh\n", 0o755 if self.modes else None)
        tree["private.txt"] = _file(b"secret\n", 0o600 if self.modes else None)
        tree["stamped.txt"] = _file(b"stamp\n", mtime=STAMP_EPOCH)
        tree |= {f"small/{i}": _file(f"{i}\n".encode()) for i in range(1, self.small_files + 1)}
        if self.symlinks:
            tree["link"] = Node("link", target="data/big.bin")
        return tree

    def seen(self, actual: Tree) -> Tree:
        """``actual`` with what ``expected`` leaves open blanked out, so that the two
        compare equal exactly when the workout's outcome holds (stray entries stay)."""
        expected = self.expected()
        seen: Tree = {}
        for rel, node in actual.items():
            want = expected.get(rel)
            blank: dict[str, Any] = {
                f.name: None for f in fields(Node) if want and getattr(want, f.name) is None
            }
            seen[rel] = replace(node, **blank)
        return seen

    def check_output(self, output: str) -> list[str]:
        """What the guest's own reads got wrong (empty: nothing)."""
        problems = []
        lines = output.splitlines()
        if "WORKOUT-DONE" not in lines:
            problems.append("the script did not finish")
        if "hello" not in lines:
            problems.append("moved.txt not read back after the remount")
        if str(self.small_files) not in (line.strip() for line in lines):
            problems.append(f"ls of small/ did not count {self.small_files}")
        stamped = [line for line in lines if line.startswith("stat ") and "stamped" in line]
        if not stamped or stamped[0].split()[-1] != str(STAMP_EPOCH):
            problems.append(f"the guest sees stamped.txt's mtime as {stamped}")
        if self.modes:
            modes = {line.split()[1].rsplit("/", 1)[-1]: line.split()[2] for line in lines
                     if line.startswith("stat ")}  # fmt: skip
            if modes.get("script.sh") != "755" or modes.get("private.txt") != "600":
                problems.append(f"the guest sees modes {modes}")
        return problems
