"""Transfer accounting for chunked transfers (core layer): prometheus counters and one
JSON log line per transfer, at the hub and at the spoke alike.

``role`` is the site's part (hub or spoke), ``direction`` which way the bytes went
(``down``: hub to spoke, ``up``: spoke to hub). ``logical`` counts the file bytes a
transfer delivered; ``wire`` the bytes it put on the link for them (frames, maps, ids);
``dedup`` the bytes not sent because the receiver already held those chunks; and
``compression`` what encoding (zstd, deltas) saved on the chunks that were sent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import Counter
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

_LABELS = ["role", "direction"]
LOGICAL = Counter("loomfs_transfer_logical_bytes_total", "File bytes delivered", _LABELS)
WIRE = Counter("loomfs_transfer_wire_bytes_total", "Bytes put on the link for them", _LABELS)
DEDUP = Counter(
    "loomfs_transfer_dedup_saved_bytes_total", "Bytes not sent: the receiver held them", _LABELS
)
COMPRESSION = Counter(
    "loomfs_transfer_compression_saved_bytes_total", "Bytes saved by encoding sent chunks", _LABELS
)
CORRUPT = Counter(
    "loomfs_transfer_corrupt_frames_total", "Frames that failed verification on receipt", _LABELS
)

#: the counters ``loomfs status`` prints, by the name it prints them under
REPORTED = {
    "logical": LOGICAL,
    "wire": WIRE,
    "dedup saved": DEDUP,
    "compression saved": COMPRESSION,
    "corrupt frames": CORRUPT,
}


@dataclass(slots=True)
class Transfer:
    """The accounting of one transfer (one file read or written, or one request)."""

    role: str
    direction: str
    path: str
    logical: int = 0
    wire: int = 0
    dedup: int = 0
    compression: int = 0

    def sent(self, raw_length: int, frame_length: int) -> None:
        self.logical += raw_length
        self.wire += frame_length
        self.compression += raw_length - frame_length

    def held(self, raw_length: int) -> None:
        self.logical += raw_length
        self.dedup += raw_length

    def done(self) -> None:
        labels = (self.role, self.direction)
        LOGICAL.labels(*labels).inc(self.logical)
        WIRE.labels(*labels).inc(self.wire)
        DEDUP.labels(*labels).inc(self.dedup)
        COMPRESSION.labels(*labels).inc(max(0, self.compression))
        if self.logical:
            log.info(
                "chunk transfer",
                extra={
                    "role": self.role,
                    "direction": self.direction,
                    "path": self.path,
                    "logical": self.logical,
                    "wire": self.wire,
                    "dedup_saved": self.dedup,
                    "compression_saved": self.compression,
                },
            )


def summarize(exposition: str) -> dict[tuple[str, str], dict[str, float]]:
    """The transfer counters in a site's /metrics text, by (role, direction)."""
    names = {f"{counter._name}_total": label for label, counter in REPORTED.items()}
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            label = names.get(sample.name)
            if label is None:
                continue
            key = (sample.labels.get("role", "?"), sample.labels.get("direction", "?"))
            rows.setdefault(key, dict.fromkeys(REPORTED, 0.0))[label] = sample.value
    return rows
