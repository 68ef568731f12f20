"""PyTorch on loomfs (protocol layer, client side): a dataset of files, a sampler that tells
the spoke what comes next, and checkpoints.

```python
import loomfs.torch as lt
ds = lt.FileDataset("loomfs://gpu-west/datasets/sample/train", decode=my_decode)
sampler = lt.PlanSampler(torch.utils.data.DistributedSampler(ds, seed=7), dataset=ds)
loader = torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=64, num_workers=4)
lt.save_checkpoint(state, "loomfs://gpu-west/checkpoints/run1/step-1000.pt")
```

Everything goes through ``loomfs://`` (``loomfs.sdk.fsspec``), so ``FileDataset`` works in
DataLoader worker processes (the filesystem pickles by its options) and
``torch.distributed.checkpoint``'s ``FsspecWriter``/``FsspecReader`` take ``loomfs://`` paths
as they are. ``PlanSampler`` publishes each epoch's explicit order to the spoke (the
sampler's own output, so any sampler works, ``DistributedSampler`` included, whatever its
permutation algorithm) and reports progress; if the spoke cannot be reached it logs and
training goes on, only without prefetching.

torch is optional for loomfs: only this module needs it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar

try:
    import torch
    import torch.distributed as dist
    from torch.utils.data import Dataset, DistributedSampler, Sampler
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "loomfs.torch needs PyTorch: pip install torch (CPU: --index-url "
        "https://download.pytorch.org/whl/cpu)"
    ) from exc

import fsspec

from .prefetch.plan import Plan
from .rest.client import RestNamespace
from .sdk.fsspec import LoomFileSystem
from .sdk.local import LocalReader

log = logging.getLogger(__name__)

T = TypeVar("T")
HEARTBEAT_S = 0.2  # at most this often; a heartbeat still on its way is not doubled


def _loomfs(url: str, storage_options: dict[str, Any] | None = None) -> tuple[LoomFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    if not isinstance(fs, LoomFileSystem):
        raise ValueError(f"not a loomfs:// URL: {url}")
    return fs, path


class FileDataset(Dataset[T], Generic[T]):
    """Map-style: sample ``i`` is the ``i``-th file under ``url`` in path order, as bytes or
    as ``decode(bytes)``. The file list (with sizes) is taken once, at construction.
    ``storage_options`` are the filesystem's (``key``/``secret``, ``ca_cert``, ``sites``);
    they travel to DataLoader workers with the dataset. ``local``: read what a spoke on
    this machine has cached from its cache files (``sdk.local``), else over HTTP."""

    def __init__(
        self,
        url: str,
        decode: Callable[[bytes], T] | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        local: bool = True,
    ) -> None:
        self.url = url
        self.local = local
        # (pid, reader): each DataLoader worker (a forked process) connects on its own
        self._local: tuple[int, LocalReader | None] | None = None
        fs, root = _loomfs(url, storage_options)
        self._options = dict(fs.storage_options)
        found: dict[str, dict[str, Any]] = self.fs.find(root, detail=True)
        files = sorted((name, info["size"]) for name, info in found.items())
        if not files:
            raise FileNotFoundError(f"no files under {url}")
        self.files = [name for name, _ in files]
        self.sizes = [size for _, size in files]
        self.decode = decode

    @property
    def fs(self) -> LoomFileSystem:
        """This process's filesystem: fsspec hands a DataLoader worker (a forked process) a
        new instance, as the parent's I/O loop thread did not survive the fork."""
        return LoomFileSystem(**self._options)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> T:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[T]:
        """The samples of a batch (DataLoader asks for a batch's indices at once): where
        the site is a spoke on this machine, one request opens them all and their bytes
        come from its cache files; what it hands out no file for comes over HTTP."""
        fs = self.fs
        names = [self.files[i] for i in indices]
        got: list[bytes | None] = [None] * len(names)
        local = self._local_reader(fs)
        if local is not None:
            try:
                got = local.read_many([(fs.split(name)[1], 0, None) for name in names])
            except OSError as exc:  # the spoke went away: its HTTP says what is wrong
                log.warning("local reads from the spoke failed, reading over HTTP: %s", exc)
                self._local = (os.getpid(), None)
        datas: list[bytes] = [data if data is not None else fs.cat_file(name)
                              for data, name in zip(got, names, strict=True)]  # fmt: skip
        if self.decode is None:
            return datas  # type: ignore[return-value]
        return [self.decode(data) for data in datas]

    def _local_reader(self, fs: LoomFileSystem) -> LocalReader | None:
        pid = os.getpid()
        if self._local is None or self._local[0] != pid:
            self._local = (pid, fs.local_reader(self.files[0]) if self.local else None)
        return self._local[1]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_local": None}  # a spawned worker connects on its own

    def paths(self) -> list[str]:
        """Namespace paths of the samples, as the spoke names them."""
        return [self.fs.split(name)[1] for name in self.files]

    def site(self) -> RestNamespace:
        """The hub or spoke this dataset is read through."""
        return self.fs.client(self.files[0])


class PlanSampler(Sampler[int]):
    """Wraps any sampler; publishes each epoch's order to the spoke, then heartbeats.

    ``job`` names the training run (default ``$LOOMFS_JOB`` or a random id); a rank (from
    torch.distributed, or the wrapped ``DistributedSampler``) is appended, so every rank of a
    job publishes its own plan. Positions count samples since the job began, across epochs.
    """

    def __init__(
        self,
        sampler: Sampler[Any],  # torch types DistributedSampler by the dataset's items
        *,
        dataset: FileDataset[Any],
        job: str | None = None,
        rank: int | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.sampler = sampler
        self.dataset = dataset
        if rank is None:
            if isinstance(sampler, DistributedSampler):
                rank = sampler.rank
            elif dist.is_available() and dist.is_initialized():
                rank = dist.get_rank()
            else:
                rank = 0
        self.job = f"{job or os.environ.get('LOOMFS_JOB') or uuid.uuid4().hex[:12]}/{rank}"
        self.heartbeat_s = heartbeat_s
        self.position = 0
        self.epoch: int | None = None
        self._paths = dataset.paths()
        self._pending: concurrent.futures.Future[Any] | None = None
        self._last_beat = 0.0

    def __len__(self) -> int:
        if not isinstance(self.sampler, Sized):
            raise TypeError("the wrapped sampler has no length")
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the wrapped sampler (``DistributedSampler`` reshuffles by it)."""
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)
            self.epoch = epoch

    def _order(self) -> list[int]:
        return [int(i) for i in self.sampler]

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        ahead: list[int] = []
        if self.epoch is not None:
            # A sampler ordered by epoch (set_epoch) can say what the next epoch reads: the
            # plan then spans the boundary, so the end of this epoch keeps what the next
            # one starts with. The next epoch publishes its own plan anyway.
            self.sampler.set_epoch(self.epoch + 1)  # type: ignore[attr-defined]
            try:
                ahead = self._order()
            finally:
                self.sampler.set_epoch(self.epoch)  # type: ignore[attr-defined]
        plan = Plan(self.job, self.position, tuple(order + ahead))
        site = self.dataset.site()
        self._send(site.publish_plan(plan.encode(), self._paths, self.dataset.sizes), "publish")
        for index in order:
            yield index
            self.position += 1
            now = time.monotonic()
            if now - self._last_beat >= self.heartbeat_s and (
                self._pending is None or self._pending.done()
            ):
                self._last_beat = now
                self._send(site.heartbeat(self.job, self.position), "heartbeat")

    def end(self) -> None:
        """The job is done: the spoke stops keeping its plan's files."""
        self._send(self.dataset.site().end_plan(self.job), "end")

    def _send(self, call: Any, what: str) -> None:
        """Fire and forget on the filesystem's I/O loop; a failure is logged, never raised."""
        future = self.dataset.fs.submit_threadsafe(call)
        self._pending = future

        def done(sent: concurrent.futures.Future[Any]) -> None:
            if not sent.cancelled() and sent.exception() is not None:
                log.warning("could not %s the plan at the spoke: %s", what, sent.exception())

        future.add_done_callback(done)


def save_checkpoint(
    obj: Any, url: str, *, storage_options: dict[str, Any] | None = None, **kwargs: Any
) -> None:
    """``torch.save`` into a loomfs file, streamed as it is written. At a spoke with
    write-back it returns once the spoke's journal holds it; ``sync_site`` waits for the hub."""
    with fsspec.open(url, "wb", **(storage_options or {})) as out:
        torch.save(obj, out, **kwargs)


def load_checkpoint(
    url: str, *, storage_options: dict[str, Any] | None = None, **kwargs: Any
) -> Any:
    """``torch.load`` from a loomfs file (``weights_only`` and the rest pass through)."""
    with fsspec.open(url, "rb", **(storage_options or {})) as source:
        return torch.load(source, **kwargs)


def sync_site(url: str, *, storage_options: dict[str, Any] | None = None) -> None:
    """Wait until the spoke behind ``url`` has committed every acknowledged write at its hub
    (after ``save_checkpoint`` with write-back: the checkpoint is then at the hub)."""
    fs, path = _loomfs(url, storage_options)
    fs.call(fs.client(path).sync())
