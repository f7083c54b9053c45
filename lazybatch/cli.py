"""The ``lazybatch`` command line: one entry point, one module per subcommand under lazybatch/commands/."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from lazybatch import __version__
from lazybatch.batcher.errors import LazyBatchError

# Each module defines register(subparsers) and sets ``func`` on its parser. Heavy imports stay inside the commands.
COMMAND_MODULES = (
    "lazybatch.commands.simulate",
    "lazybatch.commands.export",
    "lazybatch.commands.split",
    "lazybatch.commands.profile",
    "lazybatch.commands.npu",
    "lazybatch.commands.serve",
    "lazybatch.commands.scale_out",
    "lazybatch.commands.repo",
    "lazybatch.commands.infer",
    "lazybatch.commands.load",
    "lazybatch.commands.perf",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lazybatch",
        description="Layer-wise (lazy) batching for Triton Inference Server: split models into stages, profile "
                    "them, serve them under a batching policy, and simulate policies on latency tables.")
    parser.add_argument("--version", action="version", version=f"lazybatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LazyBatchError as e:
        print(f"lazybatch {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        from lazybatch.sessions.install import is_missing_onnxruntime, missing_message

        if not is_missing_onnxruntime(e):
            raise
        print(f"lazybatch {args.command}: error: {missing_message()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lazybatch {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
