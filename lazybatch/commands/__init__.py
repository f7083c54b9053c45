"""One module per ``lazybatch`` subcommand; each exposes ``register(subparsers)``."""

from __future__ import annotations

from typing import Callable, TypeVar

from lazybatch.batcher.errors import ConfigError

T = TypeVar("T", int, float)


def comma_list(text: str, field: str, kind: Callable[[str], T] = float) -> list[T]:
    """'1,2, 4' -> [1, 2, 4]; a clear error naming the flag otherwise."""
    try:
        vals = [kind(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise ConfigError(f"expected comma-separated {what}, got {text!r}", field=field) from None
    if not vals:
        raise ConfigError("at least one value is needed", field=field)
    return vals
