"""Moved to ``cozygpu.base.logging``; kept until ``settings.py`` imports it from there."""

from __future__ import annotations

from cozygpu.base.logging import FieldsAdapter, JsonFormatter, TextFormatter, configure, get_logger

__all__ = ["FieldsAdapter", "JsonFormatter", "TextFormatter", "configure", "get_logger"]
