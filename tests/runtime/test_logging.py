"""Structured log lines: JSON with fields, UTC timestamps, tracebacks as a field; written by a thread."""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Iterator

import pytest

from cozygpu.base.logging import JsonFormatter, TextFormatter, configure, get_logger


@pytest.fixture
def far_east_zone() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


def record(msg: str, **fields: object) -> logging.LogRecord:
    captured: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, rec: logging.LogRecord) -> None:
            captured.append(rec)

    base = logging.getLogger(f"test.{msg}")
    base.propagate = False
    base.addHandler(Keep())
    base.setLevel(logging.DEBUG)
    get_logger(base.name).bind(**fields).info(msg)
    return captured[0]


def test_a_json_line_carries_the_fields_next_to_time_level_logger_and_message(far_east_zone: None) -> None:
    line = json.loads(JsonFormatter().format(record("lease acquired", identity="a", lease="ns/l")))
    assert line["msg"] == "lease acquired"
    assert line["level"] == "info"
    assert line["identity"] == "a"
    assert line["lease"] == "ns/l"
    assert line["ts"].endswith("Z")
    logged = time.strftime("%Y-%m-%dT%H", time.gmtime())
    assert line["ts"].startswith(logged), "the timestamp is UTC, not the machine's zone"


def test_a_bound_logger_adds_its_fields_to_every_line() -> None:
    captured: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, rec: logging.LogRecord) -> None:
            captured.append(rec)

    base = logging.getLogger("test.bound")
    base.propagate = False
    base.addHandler(Keep())
    base.setLevel(logging.DEBUG)
    get_logger("test.bound").bind(lease="ns/l").warning("renew failed", error="timeout")
    line = json.loads(JsonFormatter().format(captured[0]))
    assert (line["lease"], line["error"], line["level"]) == ("ns/l", "timeout", "warning")


def test_text_lines_put_the_fields_after_the_message() -> None:
    text = TextFormatter().format(record("serving", address="127.0.0.1:8081"))
    assert text.endswith("info test.serving serving address=127.0.0.1:8081")


def test_configure_writes_json_lines_through_its_thread_with_tracebacks_as_a_field() -> None:
    stream = io.StringIO()
    stop = configure(fmt="json", level="info", stream=stream)
    try:
        log = get_logger("test.configured")
        log.debug("hidden")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("stage failed", stage="caches")
    finally:
        stop()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["msg"] for line in lines] == ["stage failed"]
    assert lines[0]["stage"] == "caches"
    assert "ValueError: boom" in lines[0]["error"]
