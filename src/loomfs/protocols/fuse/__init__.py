"""The FUSE front-end (protocol layer): a POSIX mount over any ``Namespace`` with pyfuse3.

``mount.serve`` mounts and runs it; ``ops.LoomOperations`` translates kernel requests into
namespace calls; no catalog, cache or policy logic lives here.
"""
