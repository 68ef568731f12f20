"""A WAN the kernel shapes, for benchmarks (testing layer): a network namespace for the
far site, a veth pair to it, ``tbf`` for the rate and a splicing relay for the delay.

``LinkEmulator`` (``wan``) copies every byte through Python, and on a small machine that
copy, not loomfs, set the ceiling of a benchmark. Here the far site (a hub) runs in a
``NetNamespace`` of its own; this namespace reaches it over a veth pair whose two ends
each carry a token bucket filter (``tc qdisc ... tbf``), so each direction has the
link's rate, shaped by the kernel. The kernel has no ``netem``, and ``tbf`` only delays
what queues behind it, so the round trip comes from a relay in the far namespace
(``python -m loomfs.testing.kwan``): it moves bytes socket -> pipe -> socket with
``splice(2)``, never into user space, and holds each piece in its pipe until its
one-way latency has passed (each direction delayed once: the RTT is twice the latency).
Its CPU (``cpu_seconds``) is the emulator's cost to report beside a benchmark's figures;
the rate costs the kernel a few softirq cycles per packet. ``down.bytes``/``up.bytes``
count what crossed the veth pair (the kernel's counters: payload plus TCP/IP headers).

    with KernelLink(rate=100e6, latency=0.01) as link:
        hub = HubProcess(...)    # with prefix link.command([]): it runs in the far namespace
        host, port = link.forward(hub_fabric_port)   # the spoke dials host:port
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import os
import secrets
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .netns import NetNamespace, ip, random_subnet

#: one splice's most; a relay's pipe holds as much (the system's pipe-max-size allows 1 MiB)
PIECE = 1 << 20
#: pipes per direction of a connection: what may be in flight, 8 MiB, is well above a
#: 1 Gbit/s x 40 ms bandwidth-delay product
PIPES = 8


class Counter:
    """Bytes one device of this namespace has sent or received so far."""

    def __init__(self, device: str, which: str) -> None:
        self._path = Path(f"/sys/class/net/{device}/statistics/{which}_bytes")

    @property
    def bytes(self) -> int:
        return int(self._path.read_text())


def tc(*args: str) -> None:
    done = subprocess.run(["tc", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {done.stderr.strip()} (the kernel needs "
                           "sch_tbf: modprobe sch_tbf)")  # fmt: skip


def tbf(rate: float) -> list[str]:
    """A token bucket filter for ``rate`` bytes/s: a burst of 4 ms of the rate (at least
    256 KiB: a veth hands over 64 KiB GSO packets) and a queue of 50 ms, so TCP's window
    fills the link without the filter dropping its bursts."""
    burst = max(256 * 1024, int(rate * 0.004))
    return ["tbf", "rate", f"{int(rate * 8)}bit", "burst", str(burst), "latency", "50ms"]


class KernelLink(NetNamespace):
    """The far namespace, the shaped veth pair to it and the relays that delay; a context
    manager. ``rate``: bytes/s each way (None: unshaped); ``latency``: one-way seconds."""

    def __init__(self, *, rate: float | None = None, latency: float = 0.0) -> None:
        super().__init__()
        if shutil.which("tc") is None:
            raise RuntimeError("the kernel link needs tc: apt-get install -y iproute2")
        self.rate, self.latency = rate, latency
        subnet = random_subnet()
        self.near_ip, self.host_ip = f"{subnet}.1", f"{subnet}.2"
        tag = secrets.token_hex(4)
        self.near, self.far = f"lk{tag}n", f"lk{tag}f"
        self.down = Counter(self.near, "rx")  # far -> near: what the spoke fetched
        self.up = Counter(self.near, "tx")
        self._relays: list[subprocess.Popen[bytes]] = []

    def setup(self) -> None:
        ip("link", "add", self.near, "type", "veth", "peer", "name", self.far, "netns", self.netns)
        ip("addr", "add", f"{self.near_ip}/24", "dev", self.near)
        ip("-n", self.netns, "addr", "add", f"{self.host_ip}/24", "dev", self.far)
        ip("link", "set", self.near, "up")
        ip("-n", self.netns, "link", "set", self.far, "up")
        if self.rate:
            tc("qdisc", "replace", "dev", self.near, "root", *tbf(self.rate))
            tc("-n", self.netns, "qdisc", "replace", "dev", self.far, "root", *tbf(self.rate))

    def teardown(self) -> None:
        # the pair goes with the namespace; this end first, so no route to it lingers
        subprocess.run(["ip", "link", "del", self.near], capture_output=True, check=False)

    def forward(self, port: int) -> tuple[str, int]:
        """The address this namespace dials for the far namespace's ``127.0.0.1:port``:
        a relay delaying by ``latency`` (with none, still the relay: the port is the far
        side's loopback, which this namespace can't reach)."""
        ready = self.workdir / f"relay-{port}"
        relay = self.popen([
            sys.executable, "-m", "loomfs.testing.kwan", "--listen", self.host_ip,
            "--target", str(port), "--latency", str(self.latency), "--ready", str(ready),
        ])  # fmt: skip
        self._relays.append(relay)
        deadline = time.monotonic() + 30
        while not ready.exists():
            if relay.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the link's relay did not start ({relay.returncode})")
            time.sleep(0.02)
        return self.host_ip, int(ready.read_text())

    def cpu_seconds(self) -> float:
        """CPU time the relays used so far (user and system): the emulator's cost."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for relay in self._relays:
            with contextlib.suppress(FileNotFoundError):
                fields = Path(f"/proc/{relay.pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / ticks
        return total


# ---------------------------------------------------------------- the relay (its own process)


class DelayLine:
    """One direction of a relayed connection: ``src``'s bytes reach ``dst`` ``latency``
    seconds after they arrived, in order, through pipes (``splice``: no copy to Python)."""

    def __init__(self, src: socket.socket, dst: socket.socket, latency: float) -> None:
        self.src, self.dst, self.latency = src, dst, latency
        self.pipes = [os.pipe() for _ in range(PIPES)]
        for r, _ in self.pipes:
            with contextlib.suppress(OSError):  # a smaller pipe only lowers the ceiling
                fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, PIECE)
        #: (due, pipe index, bytes); bytes 0: the source's end of file
        self.queue: collections.deque[tuple[float, int, int]] = collections.deque()
        self.ready = threading.Condition()

    def run(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._intake), threading.Thread(target=self._output)]
        for thread in threads:
            thread.start()
        return threads

    def _push(self, entry: tuple[float, int, int]) -> None:
        with self.ready:
            self.queue.append(entry)
            self.ready.notify()

    def _intake(self) -> None:
        # The sockets are non-blocking, and a splice goes out only once poll says bytes
        # are there: a blocking splice from a TCP socket (kernel 6.18) kept what it had
        # moved into the pipe while it waited for the rest of its PIECE, so the tail of
        # a response sat in the relay until the peer's next bytes came (the 512 KiB
        # reply of train_stall, for up to the client's 300 s timeout).
        turn = 0
        try:
            while True:
                _wait(self.src, select.POLLIN)
                try:
                    n = os.splice(self.src.fileno(), self.pipes[turn][1], PIECE)
                except BlockingIOError:
                    continue
                if n == 0:
                    break
                self._push((time.monotonic() + self.latency, turn, n))
                turn = (turn + 1) % PIPES
        except OSError:
            self._abort()
        self._push((time.monotonic() + self.latency, -1, 0))

    def _output(self) -> None:
        try:
            while True:
                with self.ready:
                    while not self.queue:
                        self.ready.wait()
                    due, turn, n = self.queue.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if n == 0:
                    with contextlib.suppress(OSError):
                        self.dst.shutdown(socket.SHUT_WR)
                    return
                while n:
                    try:
                        n -= os.splice(self.pipes[turn][0], self.dst.fileno(), n)
                    except BlockingIOError:
                        _wait(self.dst, select.POLLOUT)
        except OSError:
            self._abort()

    def _abort(self) -> None:
        """A reset on either side ends the connection both ways, as the wire would."""
        for sock in (self.src, self.dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for r, w in self.pipes:
            os.close(r)
            os.close(w)


def _wait(sock: socket.socket, event: int) -> None:
    """Until ``sock`` is ready for ``event`` (or has failed: the splice then says how)."""
    poller = select.poll()
    poller.register(sock, event)
    poller.poll()


def _relay_one(near: socket.socket, port: int, latency: float) -> None:
    try:
        far = socket.create_connection(("127.0.0.1", port))
    except OSError:
        near.close()
        return
    for sock in (near, far):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)  # see DelayLine._intake
    lines = [DelayLine(near, far, latency), DelayLine(far, near, latency)]
    for thread in [t for line in lines for t in line.run()]:
        thread.join()
    for line in lines:
        line.close()
    near.close()
    far.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the kernel link's delaying relay")
    parser.add_argument("--listen", required=True, help="address to listen on")
    parser.add_argument("--target", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--latency", type=float, required=True, help="one-way seconds")
    parser.add_argument("--ready", type=Path, required=True, help="write the port here")
    args = parser.parse_args(argv)
    server = socket.create_server((args.listen, 0), backlog=128)
    staged = args.ready.with_suffix(".tmp")
    staged.write_text(str(server.getsockname()[1]))
    staged.rename(args.ready)  # whole, or not there: the parent polls for it
    while True:
        near, _ = server.accept()
        threading.Thread(
            target=_relay_one, args=(near, args.target, args.latency), daemon=True
        ).start()


if __name__ == "__main__":
    main()
