"""config.pbtxt as text or as the JSON Triton hands ``initialize``, to and from ``inference.ModelConfig``: parsed with
the protobuf classes tritonclient ships, never by hand. What the backend reads from it is ``settings.py``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lazybatch.batcher.errors import ConfigError


def model_config_pb2() -> Any:
    from tritonclient.grpc import model_config_pb2 as pb

    return pb


def parse_config_text(text: str, *, source: str | None = None) -> Any:
    """config.pbtxt text -> inference.ModelConfig."""
    from google.protobuf import text_format

    cfg = model_config_pb2().ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as e:
        raise ConfigError(f"not a valid model config: {e}", source=source) from None
    return cfg


def parse_config_json(text: str) -> Any:
    """Triton hands ``initialize`` the (auto-completed) config as JSON."""
    from google.protobuf import json_format

    cfg = model_config_pb2().ModelConfig()
    json_format.Parse(text, cfg, ignore_unknown_fields=True)
    return cfg


def load_config(path: str | Path) -> Any:
    p = Path(path)
    try:
        return parse_config_text(p.read_text(), source=str(p))
    except OSError as e:
        raise ConfigError(f"cannot read the model config: {e.strerror}", source=str(p)) from None


def config_to_text(cfg: Any) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(cfg)
