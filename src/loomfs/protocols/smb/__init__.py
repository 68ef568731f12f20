"""The SMB edge (protocol layer): Samba's smbd, run by loomfs over a loomfs mount.

``conf`` writes what Samba reads (smb.conf, its password file, the accounts it switches
to); ``server.SmbServer`` mounts the namespace, runs smbd as a child and keeps both in
step with the user registry. Samba speaks SMB; loomfs decides, through the mount.
"""

from .server import SmbServer

__all__ = ["SmbServer"]
