"""The FUSE front-end (protocol layer): a POSIX mount over any ``Namespace``.

``mount.serve`` mounts and runs it; ``session.Session`` speaks the kernel's protocol on
``/dev/fuse``; ``ops.LoomOperations`` translates its requests into namespace calls; no
catalog, cache or policy logic lives here.
"""
