"""NFSv3 and MOUNT v3 over the governed namespace (protocol layer); see ``server.py``."""

from .server import AccessGate, NfsServer

__all__ = ["AccessGate", "NfsServer"]
