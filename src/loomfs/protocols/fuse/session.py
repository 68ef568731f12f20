"""A FUSE session over ``/dev/fuse`` (protocol layer): mount, request loop, replies, notices.

One asyncio loop reads the kernel's requests, runs each as a task on the operations
(``ops.py``), and writes the reply; the kernel matches replies to requests by their
``unique``, so they may go back in any order. The mount itself is made by
``fusermount3``, which hands the opened device back over a socket (the protocol libfuse
uses), so it works for root and for users alike.

Passthrough: when the kernel offers it and the process may register backing files
(``CAP_SYS_ADMIN``), an open can hand the kernel a local file that holds exactly the
file's bytes; the kernel then reads it itself, at the local disk's speed, and loomfs
sees no READ for that handle.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import selectors
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

from ...core.metrics import REQUEST_SECONDS
from . import abi
from .abi import Context, EntryAttributes, FileInfo, FUSEError, ReaddirToken, SetattrFields

if TYPE_CHECKING:
    from .ops import LoomOperations

log = logging.getLogger(__name__)
#: FUSE requests (and SMB's, through Samba's mount) answered with an error, by op and
#: errno; all of them, by op, are ``loomfs_request_seconds_count`` (one metric a request:
#: the mount's loop is the data path)
ERRORS = Counter(
    "loomfs_fuse_errors_total", "FUSE requests answered with an error, by protocol, op and errno",
    ["protocol", "op", "errno"],
)  # fmt: skip

#: the largest read or write in one request, in pages of 4 KiB (1 MiB)
MAX_PAGES = 256
#: the kernel's buffer must hold the largest write plus its headers
BUFFER_SIZE = MAX_PAGES * 4096 + 4096
#: requests read from the device in one go before the loop serves others
READ_BATCH = 64
#: a request still unanswered after this long is logged (a process waiting on the mount
#: cannot be interrupted while it waits: the log says what it waits for)
SLOW_REQUEST_S = 30.0

Handler = Callable[[int, Context, bytes], Awaitable[bytes | None]]


class PollingSelector(selectors.EpollSelector):
    """epoll that, where it would block, first polls for up to ``poll_s``. A program
    waiting on the mount sends its next request a few tens of microseconds after the
    reply to its last (a create is five requests in a row); polling, the loop finds it
    awake, where sleeping cost each request a wake-up and the caches the loop's thread
    went cold in (1.4x the creates per second on a 2-core VM: docs/BENCHMARKS.md). The
    price: up to ``poll_s`` of CPU each time the loop runs out of work."""

    def __init__(self, poll_s: float) -> None:
        super().__init__()
        self.poll_s = poll_s

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self.poll_s > 0 and (timeout is None or timeout > 0):
            start = time.perf_counter()
            polling = self.poll_s if timeout is None else min(self.poll_s, timeout)
            while time.perf_counter() - start < polling:
                ready = super().select(0)
                if ready:
                    return ready
            if timeout is not None:  # a timer's due time stays where it was
                timeout = max(0.0, timeout - (time.perf_counter() - start))
        return super().select(timeout)


def event_loop(poll_us: int) -> asyncio.AbstractEventLoop:
    """The event loop a mount runs on: ``PollingSelector`` for ``poll_us`` (0: none)."""
    return asyncio.SelectorEventLoop(PollingSelector(poll_us / 1e6))


class Session:
    """A mount at ``mountpoint`` and the loop that serves it. ``ops`` must provide the
    handlers (``LoomOperations``); ``passthrough`` asks for kernel reads of local files."""

    def __init__(
        self,
        mountpoint: Path,
        options: set[str],
        *,
        passthrough: bool = True,
        protocol: str = "fuse",
    ) -> None:
        """``protocol``: what the metrics call its requests ("smb" for Samba's mount)."""
        self.mountpoint = mountpoint
        self.protocol = protocol
        #: each op's latency histogram and each (op, errno)'s error counter, looked up once
        self._latency: dict[str, Histogram] = {}
        self._errors: dict[tuple[str, int], Counter] = {}
        self.options = options
        self.want_passthrough = passthrough
        #: whether opens may hand the kernel a backing file (negotiated at init)
        self.passthrough = False
        self.fd = -1
        self._buf = bytearray(BUFFER_SIZE)
        #: requests in progress: unique -> (task, opcode, node, when it arrived); each
        #: removes itself when answered (a done callback cost a turn of the loop more)
        self._requests: dict[int, tuple[asyncio.Task[None], int, int, float]] = {}
        self._done: asyncio.Future[None] | None = None
        # entry notices wait for the directory's lock, which the kernel may hold for a
        # request this loop has yet to answer: they go from a thread of their own
        self._notices = ThreadPoolExecutor(1, thread_name_prefix="fuse-notice")
        self._handlers: dict[int, Handler] = {}

    # -- mount and unmount -----------------------------------------------------------------

    def mount(self) -> None:
        """Mount and negotiate the protocol (the kernel's INIT), or raise OSError."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with ours, theirs:
            env = {**os.environ, "_FUSE_COMMFD": str(theirs.fileno())}
            argv = ["fusermount3", "-o", ",".join(sorted(self.options)), "--",
                    str(self.mountpoint)]  # fmt: skip
            proc = subprocess.run(
                argv, env=env, pass_fds=[theirs.fileno()], capture_output=True, check=False
            )
            if proc.returncode != 0:
                message = proc.stderr.decode(errors="replace").strip()
                raise OSError(errno.EIO, f"fusermount3 could not mount: {message}")
            theirs.close()
            _, fds, _, _ = socket.recv_fds(ours, 1, 1)
        if not fds:
            raise OSError(errno.EIO, "fusermount3 mounted but handed back no device")
        self.fd = fds[0]
        os.set_inheritable(self.fd, False)
        self._init()

    def _init(self) -> None:
        """Answer the kernel's first request, INIT, before anything else is served."""
        n = os.readv(self.fd, [self._buf])
        _, opcode, unique, *_ = abi.IN_HEADER.unpack_from(self._buf)
        if opcode != abi.INIT:
            raise OSError(errno.EPROTO, f"the kernel's first FUSE request was {opcode}, not INIT")
        body = bytes(self._buf[abi.IN_HEADER.size : n]).ljust(abi.INIT_IN.size, b"\0")
        major, minor, max_readahead, flags, flags2 = abi.INIT_IN.unpack_from(body)
        offered = flags | (flags2 << 32 if flags & abi.INIT_EXT else 0)
        if major != abi.KERNEL_MAJOR or minor < 31:
            self._send(unique, -errno.EPROTO)
            raise OSError(errno.EPROTO, f"the kernel speaks FUSE {major}.{minor}; 7.31+ needed")
        # not HANDLE_KILLPRIV: the kernel clears set-user-ID and set-group-ID bits on a
        # write by someone else itself, with a setattr, as loomfs keeps modes in the catalog
        want = (
            abi.ASYNC_READ | abi.ATOMIC_O_TRUNC | abi.BIG_WRITES | abi.AUTO_INVAL_DATA
            | abi.DO_READDIRPLUS | abi.ASYNC_DIO | abi.PARALLEL_DIROPS | abi.MAX_PAGES
            | abi.INIT_EXT
        )  # fmt: skip
        if self.want_passthrough and os.geteuid() == 0:
            want |= abi.PASSTHROUGH  # registering a backing file needs CAP_SYS_ADMIN
        want &= offered
        self.passthrough = bool(want & abi.PASSTHROUGH)
        reply = abi.INIT_OUT.pack(
            abi.KERNEL_MAJOR, min(minor, abi.KERNEL_MINOR), max_readahead, want & 0xFFFFFFFF,
            64, 48, MAX_PAGES * 4096, 1, MAX_PAGES, 0, want >> 32,
            1 if self.passthrough else 0,
        )  # fmt: skip
        self._send(unique, 0, reply)
        log.info(
            "FUSE session started",
            extra={"kernel_protocol": f"{major}.{minor}", "passthrough": self.passthrough},
        )

    def unmount(self) -> None:
        """Take the mount down (lazily: open files keep working until closed) and close
        the device."""
        subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)],
                       capture_output=True, check=False)  # fmt: skip
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._notices.shutdown(wait=False, cancel_futures=True)

    # -- the request loop --------------------------------------------------------------------

    async def serve(self, ops: LoomOperations) -> None:
        """Serve requests until the file system is unmounted or ``terminate`` is called."""
        self._handlers = _handlers(ops)
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        os.set_blocking(self.fd, False)
        loop.add_reader(self.fd, self._readable)
        watch = loop.create_task(self._watch_slow())
        try:
            await self._done
        finally:
            loop.remove_reader(self.fd)
            tasks = [watch, *(task for task, *_ in self._requests.values())]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch_slow(self) -> None:
        while True:
            await asyncio.sleep(SLOW_REQUEST_S)
            now = time.monotonic()
            for _, opcode, node, began in list(self._requests.values()):
                if now - began > SLOW_REQUEST_S:
                    log.warning("a FUSE request (opcode %d, node %d) is unanswered after %d s",
                                opcode, node, now - began)  # fmt: skip

    def terminate(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _readable(self) -> None:
        for _ in range(READ_BATCH):
            try:
                n = os.readv(self.fd, [self._buf])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    continue  # a request interrupted before it was read
                if exc.errno != errno.ENODEV:
                    log.error("reading /dev/fuse failed: %s", exc)
                self.terminate()  # ENODEV: unmounted
                return
            length, opcode, unique, nodeid, uid, gid, pid, _, _ = abi.IN_HEADER.unpack_from(
                self._buf
            )
            body = bytes(self._buf[abi.IN_HEADER.size : min(length, n)])
            handler = self._handlers.get(opcode)
            if handler is None:
                if opcode != abi.INTERRUPT:  # the one request without a handler or a reply
                    self._send(unique, -errno.ENOSYS)
                continue
            task = asyncio.get_running_loop().create_task(
                self._handle(handler, opcode, unique, nodeid, Context(uid, gid, pid), body)
            )
            self._requests[unique] = (task, opcode, nodeid, time.monotonic())

    async def _handle(
        self, handler: Handler, opcode: int, unique: int, nodeid: int, ctx: Context, body: bytes
    ) -> None:
        began, error = time.perf_counter(), 0
        try:
            payload = await handler(nodeid, ctx, body)
        except FUSEError as exc:
            error = exc.errno
            self._send(unique, -exc.errno)
        except Exception:
            log.exception("FUSE request %d failed", opcode)
            error = errno.EIO
            self._send(unique, -errno.EIO)
        else:
            if payload is not None:
                self._send(unique, 0, payload)
            if opcode == abi.DESTROY:
                self.terminate()
        finally:
            self._requests.pop(unique, None)
            self._measure(handler.__name__, error, time.perf_counter() - began)

    def _measure(self, op: str, error: int, seconds: float) -> None:
        latency = self._latency.get(op)
        if latency is None:
            latency = self._latency[op] = REQUEST_SECONDS.labels(self.protocol, op)
        latency.observe(seconds)
        if error:
            counter = self._errors.get((op, error))
            if counter is None:
                name = errno.errorcode.get(error, str(error))
                counter = self._errors[op, error] = ERRORS.labels(self.protocol, op, name)
            counter.inc()

    def _send(self, unique: int, error: int, payload: bytes = b"") -> None:
        """One message to the kernel: a reply (``unique`` of its request, ``error`` a
        negative errno or 0) or a notice (``unique`` 0, ``error`` the notice's code).
        ENOENT: the request was interrupted and is gone, or the notice names what the
        kernel has forgotten already; ENODEV: unmounted meanwhile. Both change nothing."""
        header = abi.OUT_HEADER.pack(abi.OUT_HEADER.size + len(payload), error, unique)
        try:
            os.writev(self.fd, [header, payload])
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    # -- notices to the kernel ---------------------------------------------------------------

    def invalidate_inode(self, ino: int, *, attr_only: bool) -> None:
        """Drop the kernel's attributes of ``ino`` and, unless ``attr_only``, its pages
        (which waits for reads of them: call it from a thread then)."""
        notice = abi.INVAL_INODE_OUT.pack(ino, -1 if attr_only else 0, 0)
        self._send(0, abi.NOTIFY_INVAL_INODE, notice)

    def invalidate_entry_async(self, parent: int, name: bytes) -> None:
        """Make the kernel look ``name`` in ``parent`` up again, from the notice thread."""
        notice = abi.INVAL_ENTRY_OUT.pack(parent, len(name), 0) + name + b"\0"
        self._notices.submit(self._notify_quietly, abi.NOTIFY_INVAL_ENTRY, notice)

    def _notify_quietly(self, code: int, notice: bytes) -> None:
        try:
            self._send(0, code, notice)
        except OSError as exc:
            if exc.errno != errno.EBADF:  # EBADF: the device closed at unmount
                log.warning("the kernel refused a cache notice: %s", exc)

    # -- passthrough -----------------------------------------------------------------------

    def open_backing(self, fd: int) -> int | None:
        """Register ``fd`` as a backing file; its id for open replies, or None when the
        kernel refuses (a file system it cannot stack on, say)."""
        if not self.passthrough:
            return None
        arg = bytearray(abi.BACKING_MAP.pack(fd, 0, 0))
        try:
            backing_id: int = fcntl.ioctl(self.fd, abi.BACKING_OPEN, arg, True)
        except OSError as exc:
            log.warning("the kernel refused a passthrough file, reads go through loomfs: %s",
                        exc)  # fmt: skip
            return None
        return backing_id

    def close_backing(self, backing_id: int) -> None:
        arg = bytearray(backing_id.to_bytes(4, "little"))
        try:
            fcntl.ioctl(self.fd, abi.BACKING_CLOSE, arg, True)
        except OSError as exc:
            if exc.errno != errno.ENODEV and self.fd >= 0:
                log.warning("could not release passthrough file %d: %s", backing_id, exc)


# -- request decoding: one function per opcode, each calling one handler of ``ops`` -----------


def _name(body: bytes, start: int = 0) -> bytes:
    """The NUL-terminated name at ``start`` of a request's body."""
    return body[start : body.index(0, start)]


def _two_names(body: bytes) -> tuple[bytes, bytes]:
    first, second, _ = body.split(b"\0", 2)
    return first, second


def _open_out(info: FileInfo) -> bytes:
    flags = (abi.FOPEN_KEEP_CACHE if info.keep_cache else 0) | (
        abi.FOPEN_NOFLUSH if info.noflush else 0
    )
    backing = 0
    if info.backing_id is not None:
        flags |= abi.FOPEN_PASSTHROUGH
        backing = info.backing_id
    return abi.OPEN_OUT.pack(info.fh, flags, backing)


def _handlers(ops: LoomOperations) -> dict[int, Handler]:
    """The decoder of each opcode the operations serve; others are answered ENOSYS."""

    async def lookup(node: int, ctx: Context, body: bytes) -> bytes:
        return (await ops.lookup(node, _name(body), ctx)).pack_entry()

    async def forget(node: int, ctx: Context, body: bytes) -> None:
        (count,) = abi.FORGET_IN.unpack_from(body)
        await ops.forget([(node, count)])

    async def batch_forget(node: int, ctx: Context, body: bytes) -> None:
        (count, _) = abi.BATCH_FORGET_IN.unpack_from(body)
        start = abi.BATCH_FORGET_IN.size
        await ops.forget(
            [
                abi.FORGET_ONE.unpack_from(body, start + i * abi.FORGET_ONE.size)
                for i in range(count)
            ]
        )

    async def getattr(node: int, ctx: Context, body: bytes) -> bytes:
        return (await ops.getattr(node, ctx)).pack_attr_out()

    async def setattr(node: int, ctx: Context, body: bytes) -> bytes:
        (valid, _, fh, size, _, atime, mtime, _, atime_ns, mtime_ns, _, mode, _, uid, gid,
         _) = abi.SETATTR_IN.unpack_from(body)  # fmt: skip
        now = time.time_ns()
        attr = EntryAttributes(
            st_mode=mode, st_uid=uid, st_gid=gid, st_size=size,
            st_atime_ns=now if valid & abi.FATTR_ATIME_NOW else atime * 10**9 + atime_ns,
            st_mtime_ns=now if valid & abi.FATTR_MTIME_NOW else mtime * 10**9 + mtime_ns,
        )  # fmt: skip
        fields = SetattrFields(
            update_mode=bool(valid & abi.FATTR_MODE),
            update_uid=bool(valid & abi.FATTR_UID),
            update_gid=bool(valid & abi.FATTR_GID),
            update_size=bool(valid & abi.FATTR_SIZE),
            update_atime=bool(valid & (abi.FATTR_ATIME | abi.FATTR_ATIME_NOW)),
            update_mtime=bool(valid & (abi.FATTR_MTIME | abi.FATTR_MTIME_NOW)),
        )
        handle = fh if valid & abi.FATTR_FH else None
        return (await ops.setattr(node, attr, fields, handle, ctx)).pack_attr_out()

    async def readlink(node: int, ctx: Context, body: bytes) -> bytes:
        return bytes(await ops.readlink(node, ctx))

    async def symlink(node: int, ctx: Context, body: bytes) -> bytes:
        name, target = _two_names(body)
        return (await ops.symlink(node, name, target, ctx)).pack_entry()

    async def mknod(node: int, ctx: Context, body: bytes) -> bytes:
        mode, rdev, ctx.umask, _ = abi.MKNOD_IN.unpack_from(body)
        name = _name(body, abi.MKNOD_IN.size)
        return (await ops.mknod(node, name, mode, rdev, ctx)).pack_entry()

    async def mkdir(node: int, ctx: Context, body: bytes) -> bytes:
        mode, ctx.umask = abi.MKDIR_IN.unpack_from(body)
        name = _name(body, abi.MKDIR_IN.size)
        return (await ops.mkdir(node, name, mode, ctx)).pack_entry()

    async def unlink(node: int, ctx: Context, body: bytes) -> bytes:
        await ops.unlink(node, _name(body), ctx)
        return b""

    async def rmdir(node: int, ctx: Context, body: bytes) -> bytes:
        await ops.rmdir(node, _name(body), ctx)
        return b""

    async def rename(node: int, ctx: Context, body: bytes) -> bytes:
        (new_dir,) = abi.RENAME_IN.unpack_from(body)
        old, new = _two_names(body[abi.RENAME_IN.size :])
        await ops.rename(node, old, new_dir, new, 0, ctx)
        return b""

    async def rename2(node: int, ctx: Context, body: bytes) -> bytes:
        new_dir, flags, _ = abi.RENAME2_IN.unpack_from(body)
        old, new = _two_names(body[abi.RENAME2_IN.size :])
        await ops.rename(node, old, new_dir, new, flags, ctx)
        return b""

    async def link(node: int, ctx: Context, body: bytes) -> bytes:
        (old,) = abi.LINK_IN.unpack_from(body)
        name = _name(body, abi.LINK_IN.size)
        return (await ops.link(old, node, name, ctx)).pack_entry()

    async def open(node: int, ctx: Context, body: bytes) -> bytes:
        flags, _ = abi.OPEN_IN.unpack_from(body)
        return _open_out(await ops.open(node, flags, ctx))

    async def read(node: int, ctx: Context, body: bytes) -> bytes:
        fh, offset, size, *_ = abi.IO_IN.unpack_from(body)
        return bytes(await ops.read(fh, offset, size))

    async def write(node: int, ctx: Context, body: bytes) -> bytes:
        fh, offset, size, *_ = abi.IO_IN.unpack_from(body)
        data = memoryview(body)[abi.IO_IN.size : abi.IO_IN.size + size]
        return abi.WRITE_OUT.pack(await ops.write(fh, offset, data), 0)

    async def statfs(node: int, ctx: Context, body: bytes) -> bytes:
        return bytes((await ops.statfs(ctx)).pack())

    async def release(node: int, ctx: Context, body: bytes) -> bytes:
        (fh,) = abi.FH_IN.unpack_from(body)
        await ops.release(fh)
        return b""

    async def releasedir(node: int, ctx: Context, body: bytes) -> bytes:
        (fh,) = abi.FH_IN.unpack_from(body)
        await ops.releasedir(fh)
        return b""

    async def flush(node: int, ctx: Context, body: bytes) -> bytes:
        (fh,) = abi.FH_IN.unpack_from(body)
        await ops.flush(fh)
        return b""

    async def fsync(node: int, ctx: Context, body: bytes) -> bytes:
        fh, flags, _ = abi.FSYNC_IN.unpack_from(body)
        await ops.fsync(fh, bool(flags & 1))
        return b""

    async def fsyncdir(node: int, ctx: Context, body: bytes) -> bytes:
        fh, flags, _ = abi.FSYNC_IN.unpack_from(body)
        await ops.fsyncdir(fh, bool(flags & 1))
        return b""

    async def setxattr(node: int, ctx: Context, body: bytes) -> bytes:
        size, _ = abi.SETXATTR_IN.unpack_from(body)
        name = _name(body, abi.SETXATTR_IN.size)
        start = abi.SETXATTR_IN.size + len(name) + 1
        value = body[start : start + size]
        await ops.setxattr(node, name, value, ctx)
        return b""

    def _sized(value: bytes, size: int) -> bytes:
        """getxattr/listxattr: the length when asked with size 0, else the bytes."""
        if size == 0:
            return abi.GETXATTR_OUT.pack(len(value), 0)
        if len(value) > size:
            raise FUSEError(errno.ERANGE)
        return value

    async def getxattr(node: int, ctx: Context, body: bytes) -> bytes:
        size, _ = abi.GETXATTR_IN.unpack_from(body)
        name = _name(body, abi.GETXATTR_IN.size)
        return _sized(bytes(await ops.getxattr(node, name, ctx)), size)

    async def listxattr(node: int, ctx: Context, body: bytes) -> bytes:
        size, _ = abi.GETXATTR_IN.unpack_from(body)
        names = await ops.listxattr(node, ctx)
        return _sized(b"".join(name + b"\0" for name in names), size)

    async def removexattr(node: int, ctx: Context, body: bytes) -> bytes:
        await ops.removexattr(node, _name(body), ctx)
        return b""

    async def opendir(node: int, ctx: Context, body: bytes) -> bytes:
        return abi.OPEN_OUT.pack(await ops.opendir(node, ctx), 0, 0)

    def _readdir(plus: bool) -> Handler:
        async def readdir(node: int, ctx: Context, body: bytes) -> bytes:
            fh, offset, size, *_ = abi.IO_IN.unpack_from(body)
            token = ReaddirToken(size, plus)
            await ops.readdir(fh, offset, token)
            return bytes(token.buffer)

        return readdir

    async def create(node: int, ctx: Context, body: bytes) -> bytes:
        flags, mode, ctx.umask, _ = abi.CREATE_IN.unpack_from(body)
        name = _name(body, abi.CREATE_IN.size)
        info, attrs = await ops.create(node, name, mode, flags, ctx)
        return attrs.pack_entry() + _open_out(info)

    async def destroy(node: int, ctx: Context, body: bytes) -> bytes:
        return b""

    return {
        abi.LOOKUP: lookup, abi.FORGET: forget, abi.BATCH_FORGET: batch_forget,
        abi.GETATTR: getattr, abi.SETATTR: setattr, abi.READLINK: readlink,
        abi.SYMLINK: symlink, abi.MKNOD: mknod, abi.MKDIR: mkdir, abi.UNLINK: unlink,
        abi.RMDIR: rmdir, abi.RENAME: rename, abi.RENAME2: rename2, abi.LINK: link,
        abi.OPEN: open, abi.READ: read, abi.WRITE: write, abi.STATFS: statfs,
        abi.RELEASE: release, abi.FSYNC: fsync, abi.SETXATTR: setxattr,
        abi.GETXATTR: getxattr, abi.LISTXATTR: listxattr, abi.REMOVEXATTR: removexattr,
        abi.FLUSH: flush, abi.OPENDIR: opendir, abi.READDIR: _readdir(False),
        abi.READDIRPLUS: _readdir(True), abi.RELEASEDIR: releasedir,
        abi.FSYNCDIR: fsyncdir, abi.CREATE: create, abi.DESTROY: destroy,
    }  # fmt: skip
