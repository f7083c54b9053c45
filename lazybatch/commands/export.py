"""``lazybatch export MODEL --out FILE.onnx``: the paper's benchmark models as ONNX with seeded random weights."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    from lazybatch.onnx_tools.zoo import MODELS

    models = "\n".join(f"  {k:13s} {v.description}" for k, v in MODELS.items())
    p = sub.add_parser("export", help="write one of the paper's models as ONNX (random weights, no download)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Write a benchmark model as ONNX with seeded random weights. Seq2seq models "
                                   "(gnmt, transformer) hold an encoder graph and a decoder-step graph in one "
                                   f"file.\n\nmodels:\n{models}")
    p.add_argument("model", choices=sorted(MODELS), metavar="MODEL", help="one of: " + ", ".join(MODELS))
    p.add_argument("--out", required=True, type=Path, help="output .onnx file (must not exist unless --force)")
    p.add_argument("--small", action="store_true", help="a small variant of the same architecture (tests, CI)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--external-data", action="store_true",
                   help="store weights in FILE.onnx.data (automatic above 1.8 GB of weights)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lazybatch.onnx_tools.zoo import export_model

    files = export_model(args.model, args.out, small=args.small, seed=args.seed,
                         external_data=True if args.external_data else None, force=args.force)
    size = sum(f.stat().st_size for f in files)
    print(f"wrote {', '.join(str(f) for f in files)} ({size / 1e6:.1f} MB)")
    return 0
