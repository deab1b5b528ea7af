"""Structured logs: one JSON object per line (or readable text), written off the event loop.

Contract:
- ``get_logger(name)`` returns a logger whose calls take fields as keyword
  arguments: ``log.info("lease acquired", lease="ns/name", identity=me)``.
  In JSON each field becomes a key next to ``ts`` (UTC, RFC 3339), ``level``,
  ``logger`` and ``msg``; in text they follow the message as ``key=value``.
- ``configure()`` routes the root logger through a queue drained by one
  thread, so a slow stderr pipe never blocks the event loop. It returns a
  stop function that flushes what is queued; call it last.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import logging.handlers
import queue
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import IO, Any, Final

_FIELDS: Final = "cozygpu_fields"
#: Keyword arguments the stdlib logging methods take themselves.
_STDLIB_KWARGS: Final = frozenset({"exc_info", "stack_info", "stacklevel", "extra"})


class FieldsAdapter(logging.LoggerAdapter[logging.Logger]):
    """Moves keyword arguments of a logging call into the record as structured fields."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        fields = {k: kwargs.pop(k) for k in list(kwargs) if k not in _STDLIB_KWARGS}
        extra = dict(kwargs.get("extra") or {})
        extra[_FIELDS] = {**(self.extra or {}), **fields}
        kwargs["extra"] = extra
        return msg, kwargs

    def bind(self, **fields: object) -> FieldsAdapter:
        """A logger that adds ``fields`` to every line."""
        return FieldsAdapter(self.logger, {**(self.extra or {}), **fields})


def get_logger(name: str, **fields: object) -> FieldsAdapter:
    return FieldsAdapter(logging.getLogger(name), fields)


def _fields(record: logging.LogRecord) -> Mapping[str, object]:
    value = getattr(record, _FIELDS, None)
    return value if isinstance(value, dict) else {}


def _traceback(record: logging.LogRecord) -> str | None:
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    return record.exc_text


def _timestamp(record: logging.LogRecord) -> str:
    when = dt.datetime.fromtimestamp(record.created, dt.UTC)
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _fields(record).items():
            line.setdefault(key, value)
        if (trace := _traceback(record)) is not None:
            line["error"] = trace
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname.lower(), record.name, record.getMessage()]
        parts += [f"{key}={value}" for key, value in _fields(record).items()]
        text = " ".join(parts)
        if (trace := _traceback(record)) is not None:
            text += "\n" + trace
        return text


class _Enqueue(logging.handlers.QueueHandler):
    """Hands a record to the writer thread with its message and traceback already rendered.

    The stdlib version folds the traceback into the message; here it stays a
    separate field, and the structured fields ride along untouched.
    """

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        copied = copy.copy(record)
        copied.msg = record.getMessage()
        copied.args = None
        copied.exc_text = _traceback(record)
        copied.exc_info = None
        return copied


def configure(*, fmt: str, level: str, stream: IO[str] | None = None) -> Callable[[], None]:
    """Send every log record to ``stream`` (stderr) through a queue.

    Returns the function that flushes the queue and puts the previous handlers back.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, handler, respect_handler_level=False)
    root = logging.getLogger()
    previous = (list(root.handlers), root.level)
    for old in previous[0]:
        root.removeHandler(old)
    enqueue = _Enqueue(records)
    root.addHandler(enqueue)
    root.setLevel(level.upper())
    # aiohttp logs every request at INFO; probes would drown the useful lines.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    listener.start()

    def stop() -> None:
        root.removeHandler(enqueue)
        listener.stop()
        for old in previous[0]:
            root.addHandler(old)
        root.setLevel(previous[1])

    return stop
