"""A real Linux NFS and SMB client for tests: a throwaway QEMU guest (testing layer).

The machines loomfs is developed on run a kernel without NFS or CIFS clients; a guest with
Debian's stock kernel and a busybox initramfs is one, booted under software emulation in a
network namespace of its own (``vm``), from an image cached per machine (``image``). What
it mounts is described by ``NfsExport`` / ``SmbShare``; nfs-ganesha and Samba are the
reference servers (``servers``); ``Workout`` is the everyday-operations run (``workout``).

    with Guest() as guest, Ganesha(guest, export_dir) as nfs:
        result = guest.run(f"{nfs.export.mount('/mnt')} && ls -l /mnt", share=some_dir)
"""

from .servers import SEED_NFS_OPTIONS, Ganesha, NfsExport, Samba, SmbShare, start_rpcbind
from .vm import Guest, GuestError, GuestResult
from .workout import Node, Tree, Workout, snapshot

__all__ = [
    "SEED_NFS_OPTIONS",
    "Ganesha",
    "Guest",
    "GuestError",
    "GuestResult",
    "NfsExport",
    "Node",
    "Samba",
    "SmbShare",
    "Tree",
    "Workout",
    "snapshot",
    "start_rpcbind",
]
