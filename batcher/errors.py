"""Errors the scheduler core raises for bad configuration or input files."""

from __future__ import annotations


class LazyBatchError(Exception):
    """Base class: every error this package raises on purpose derives from it."""


class ConfigError(LazyBatchError, ValueError):
    """A model graph, latency table, histogram, trace or policy setting is invalid.

    The message names the offending field (and file, when one was read) and says what would fix it.
    """

    def __init__(self, message: str, *, field: str | None = None, source: str | None = None) -> None:
        where = []
        if source:
            where.append(str(source))
        if field:
            where.append(f"field {field!r}")
        prefix = f"{': '.join(where)}: " if where else ""
        super().__init__(prefix + message)
        self.message = message
        self.field = field
        self.source = source

    def at(self, source: str | None) -> "ConfigError":
        """The same error, said of the file ``source`` (for errors raised before the file name was known)."""
        return self if self.source or not source else ConfigError(self.message, field=self.field, source=source)
