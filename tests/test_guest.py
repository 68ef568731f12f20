"""The QEMU guest harness (loomfs.testing.guest), proven against reference servers: the
stock Linux NFS client on nfs-ganesha with the Kubernetes recipe's exact mount options,
the stock cifs client on plain Samba, outcomes checked on the servers' side."""

from __future__ import annotations

import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.testing.guest import Ganesha, Guest, Samba, Workout, snapshot
from loomfs.testing.guest.image import cpio, require

pytestmark = pytest.mark.slow

names = st.text(alphabet="abcdefghij0123_-.", min_size=1, max_size=12).filter(
    lambda name: name not in {".", ".."}
)


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(names, st.binary(max_size=300), max_size=8), st.sampled_from(["", "d/"]))
def test_cpio_archive_unpacks_to_the_same_files(files: dict[str, bytes], prefix: str) -> None:
    entries = [("d", stat.S_IFDIR | 0o755, b"")] if prefix else []
    entries += [(prefix + name, stat.S_IFREG | 0o640, data) for name, data in files.items()]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["busybox", "cpio", "-i", "-d"], input=cpio(entries), cwd=tmp, check=True,
                       capture_output=True)  # fmt: skip
        unpacked = {
            str(path.relative_to(tmp)): path.read_bytes()
            for path in Path(tmp).rglob("*")
            if path.is_file()
        }
    assert unpacked == {prefix + name: data for name, data in files.items()}


def _namespaces() -> str:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return listed.stdout


_ABANDONED = """
import time
from loomfs.testing.guest import Guest
with Guest() as guest:
    server = guest.popen(["sleep", "1000"])
    print(guest.netns, guest.workdir, server.pid, flush=True)
    time.sleep(1000)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_what_a_killed_process_left_behind_is_swept_by_the_next_guest() -> None:
    owner = subprocess.Popen([sys.executable, "-c", _ABANDONED], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    netns, workdir, pid = owner.stdout.readline().split()
    owner.kill()
    owner.wait()
    owner.stdout.close()
    assert netns in _namespaces()
    assert _running(int(pid))
    with Guest():
        pass
    assert netns not in _namespaces()
    assert not Path(workdir).exists()
    assert not _running(int(pid))


def test_guest_reports_its_status_and_works_with_the_host_while_it_runs(tmp_path: Path) -> None:
    script = """nc $HOST_IP $PORT
echo ready > /host/ready
while [ ! -e /host/go ]; do sleep 0.1; done
cat /host/go
uname -r > /host/kernel
echo 'half a line'
exit 7
"""
    with Guest() as guest, ThreadPoolExecutor(1) as pool:
        listener = guest.listen()

        def serve() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.sendall(b"from a server in this process\n")

        threading.Thread(target=serve, daemon=True).start()
        port = str(listener.getsockname()[1])
        running = pool.submit(guest.run, script, share=tmp_path, env={"PORT": port}, check=False)
        # the host acts while the guest runs, in step through files in the share
        while not (tmp_path / "ready").exists() and not running.done():
            time.sleep(0.05)
        (tmp_path / "go.part").write_text("go on\n")
        (tmp_path / "go.part").rename(tmp_path / "go")
        result = running.result()
        listener.close()
    assert result.rc == 7
    assert result.output.splitlines() == ["from a server in this process", "go on", "half a line"]
    assert (tmp_path / "kernel").read_text().strip() == guest.image.kernel_version
    assert guest.netns not in _namespaces()


def test_ganesha_nfsv3_with_the_seed_options(tmp_path: Path) -> None:
    export, share = tmp_path / "export", tmp_path / "share"
    export.mkdir()
    share.mkdir()
    workout = Workout(seed=15)
    workout.prepare(share)
    with Guest() as guest, Ganesha(guest, export) as nfs:
        assert nfs.export.options == "vers=3,proto=tcp,nolock"
        started = guest.processes
        result = guest.run(workout.script(nfs.export.mount("/mnt")), share=share)
    assert workout.check_output(result.output) == []
    assert "link -> data/big.bin" in result.output
    assert workout.seen(snapshot(export)) == workout.expected()
    assert (share / "out/big.bin").read_bytes() == workout.big
    assert [proc.poll() is not None for proc in started] == [True, True]
    assert guest.netns not in _namespaces()


def test_samba_with_the_kernel_cifs_client(tmp_path: Path) -> None:
    shared, share = tmp_path / "shared", tmp_path / "share"
    shared.mkdir()
    share.mkdir()
    # SMB 3 without POSIX extensions has neither symlinks nor modes
    workout = Workout(seed=16, big_mib=8, symlinks=False, modes=False)
    workout.prepare(share)
    with Guest() as guest, Samba(guest, shared) as smb:
        assert smb.share.options == "vers=3.1.1"
        started = guest.processes
        result = guest.run(workout.script(smb.share.mount("/mnt")), share=share)
    assert workout.check_output(result.output) == []
    assert workout.seen(snapshot(shared)) == workout.expected()
    assert (share / "out/big.bin").read_bytes() == workout.big
    assert all(proc.poll() is not None for proc in started)
    assert guest.netns not in _namespaces()


def test_a_missing_prerequisite_says_how_to_install_it() -> None:
    with pytest.raises(RuntimeError, match="apt-get install -y qemu-system-x86 busybox-static"):
        require("loomfs-no-such-program")
