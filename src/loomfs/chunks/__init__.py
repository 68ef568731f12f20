"""Chunks: the unit of transfer and dedup between sites (core layer, no network).

FastCDC cuts files into content-defined chunks named by BLAKE3 (``cdc``), a ``ChunkMap``
lists them per file version (``chunkmap``), frames carry them raw, zstd-compressed or as
a delta against an older version (``codec``), ``bundle`` carries many small files in
one frame (deltas too), ``plan`` picks the chunks a receiver lacks,
and ``pipeline`` runs hashing and compression on a thread pool.

Nothing is imported here: ``cdc``, ``codec`` and ``pipeline`` need the ``chunks`` extra
(FastCDC, BLAKE3, zstd, numpy), ``chunkmap`` and ``records`` do not, so a site or client
installed without it imports what it uses and starts.
"""
