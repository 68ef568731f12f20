"""Structured logging (core layer): one JSON object per line, or plain text for humans."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# attributes every LogRecord has; anything else was passed with extra= and is a field
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """What was passed with extra=: the record's structured fields."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    """A line for humans: time, level, logger, message, then each field as key=value (a
    value with spaces, quotes or '=' in JSON quotes, so that a line stays one line)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={_text(v)}" for k, v in _fields(record).items())
        if not fields:
            return line
        head, newline, rest = line.partition("\n")  # a traceback stays below the fields
        return f"{head} {fields}{newline}{rest}"


def _text(value: object) -> str:
    text = str(value)
    plain = text and not any(c.isspace() or c in '"=\\' or not c.isprintable() for c in text)
    return text if plain else json.dumps(text)


def setup_logging(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
