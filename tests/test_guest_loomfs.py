"""loomfs's NFS and SMB servers with the stock Linux kernel clients (the QEMU guest of
``loomfs.testing.guest``): a ``loomfs hub serve`` process inside the guest's network
namespace serves a posix volume at /x over NFS and SMB (and REST, on the namespace's
loopback); the guest mounts it with the Kubernetes recipe's options plus the ports (no
portmapper), runs the harness's ``Workout``, works beside the host's REST calls on the
same files, mounts the SMB share with cifs as alice (her password set as a user would,
``loomfs user passwd``), and mounts a spoke of the hub (in the same namespace) over NFS.
What the guest did is checked on the volume's disk; one boot.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loomfs.core.types import SYSTEM
from loomfs.testing.guest import Guest, Workout, snapshot
from loomfs.testing.guesthub import GuestHub, nfs_options

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: NFS and MOUNT share one port; with no portmapper the client is told it (the
#: Kubernetes manifests in docs/kubernetes/ mount with exactly these options)
NFS_PORT = 2049
NFS_OPTIONS = nfs_options(NFS_PORT)
SPOKE_NFS_PORT = 2051

#: the guest's second part, after the workout: it writes a file the host then reads over
#: REST, and waits (on ``stat``, which the attribute cache answers) until a change the
#: host made over REST shows
CROSS = """
mkdir -p /m2
{mount}
cat /m2/shared.txt
echo 'from the guest' > /m2/fromguest.txt
touch /host/guest-wrote
while [ ! -e /host/host-wrote ]; do sleep 0.2; done
start=$(date +%s)
while [ "$(stat -c %s /m2/shared.txt)" != "$(cat /host/host-wrote)" ]; do
    [ $(( $(date +%s) - start )) -lt 180 ] || break
    sleep 0.5
done
if [ "$(stat -c %s /m2/shared.txt)" = "$(cat /host/host-wrote)" ]; then
    echo "SEEN-AFTER $(( $(date +%s) - start ))"
    cat /m2/shared.txt
fi
umount /m2
echo CROSS-DONE
"""

#: the guest's last part: alice writes a file over cifs that NFS then reads
CIFS = """
mkdir -p /m3
{cifs}
echo 'over cifs' > /m3/cross/fromcifs.txt
umount /m3
{nfs}
cat /m2/fromcifs.txt
umount /m2
echo CIFS-DONE
"""

#: and through a spoke of the hub: what the guest wrote at the hub is read there, and what
#: it writes there is the hub's
SPOKE = """
mkdir -p /m4
{mount}
cat /m4/fromguest.txt
echo 'via the spoke' > /m4/fromspoke.txt
umount /m4
echo SPOKE-DONE
"""


def _arrived(path: Path, running: Callable[[], bool]) -> None:
    while not path.exists():
        assert running(), f"the guest ended before it wrote {path.name}"
        time.sleep(0.1)


def test_the_kernel_nfs_client_on_a_loomfs_hub(tmp_path: Path) -> None:
    site, vol, share = tmp_path / "site", tmp_path / "vol", tmp_path / "share"
    spoke_dir = tmp_path / "spoke"
    for directory in (vol / "work", vol / "cross", share):
        directory.mkdir(parents=True)
    workout = Workout(seed=15)
    workout.prepare(share)
    users = {"alice": secrets.token_hex(12)}
    with (
        Guest() as guest,
        GuestHub(guest, site, vol, nfs_port=NFS_PORT, smb_users=users, spoke_dir=spoke_dir) as hub,
        hub.spoke(SPOKE_NFS_PORT),
        ThreadPoolExecutor(1) as pool,
    ):
        assert hub.hub.urls["nfs"] == f"nfs://{guest.host_ip}:{NFS_PORT}"
        rest = hub.rest
        rest(lambda c: c.write_bytes(SYSTEM, "/x/cross/shared.txt", b"first\n"))
        work, cross = hub.export("/x/work"), hub.export("/x/cross")
        assert work.options == NFS_OPTIONS
        smb = hub.share("alice")
        script = (
            workout.script(work.mount("/mnt"))
            + CROSS.format(mount=cross.mount("/m2"))
            + CIFS.format(cifs=smb.mount("/m3"), nfs=cross.mount("/m2"))
            + SPOKE.format(mount=hub.export("/x/cross", SPOKE_NFS_PORT).mount("/m4"))
        )
        running = pool.submit(guest.run, script, share=share)
        _arrived(share / "guest-wrote", lambda: not running.done())
        from_guest = rest(lambda c: c.read_bytes(SYSTEM, "/x/cross/fromguest.txt"))
        changed = b"second, changed at the host over REST\n"
        rest(lambda c: c.write_bytes(SYSTEM, "/x/cross/shared.txt", changed))
        (share / "host-wrote.part").write_text(str(len(changed)))
        (share / "host-wrote.part").rename(share / "host-wrote")
        result = running.result()
        from_cifs = rest(lambda c: c.read_bytes(SYSTEM, "/x/cross/fromcifs.txt"))
    print(f"guest: {result.seconds:.0f} s")
    assert workout.check_output(result.output) == []
    assert "link -> data/big.bin" in result.output
    assert workout.seen(snapshot(vol / "work")) == workout.expected()
    assert (share / "out/big.bin").read_bytes() == workout.big
    assert from_guest == b"from the guest\n"
    assert (vol / "cross" / "fromguest.txt").read_bytes() == b"from the guest\n"
    lines = result.output.splitlines()
    assert "first" in lines  # the guest read the file the host wrote before it booted
    seen = [line for line in lines if line.startswith("SEEN-AFTER ")]
    assert seen, result.output
    print(seen[0])
    assert lines[lines.index(seen[0]) + 1] == changed.decode().strip()
    assert "CROSS-DONE" in lines
    # alice's cifs write: read back over NFS in the guest, over REST and on the disk
    assert lines[lines.index("CIFS-DONE") - 1] == "over cifs"
    assert from_cifs == (vol / "cross" / "fromcifs.txt").read_bytes() == b"over cifs\n"
    # the spoke: it served the hub's file, and its write (no write-back) is on the hub's disk
    assert lines[lines.index("SPOKE-DONE") - 1] == "from the guest"
    assert (vol / "cross" / "fromspoke.txt").read_bytes() == b"via the spoke\n"
