"""``lazybatch infer``: send one request to a model on a Triton server and print what came back."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np


def register(sub: Any) -> None:
    p = sub.add_parser("infer", help="one inference request (gRPC or HTTP) to a served model")
    p.add_argument("model")
    p.add_argument("--url", default=None, help="server address (default 127.0.0.1:8001 for gRPC, :8000 for HTTP)")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input from a .npy file (default: random inputs of the model's shape)")
    p.add_argument("--batch", type=int, default=1, help="batch size of the random inputs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sla-ms", type=float, default=None, help="this request's SLA target (request parameter)")
    p.add_argument("--priority", type=int, default=None)
    p.add_argument("--src-len", type=int, default=None, help="seq2seq: source tokens of the random request "
                   "(default: the model's max_source_length)")
    p.add_argument("--max-output-len", type=int, default=None, help="seq2seq: tokens to generate at most")
    p.add_argument("--ignore-eos", action="store_true", help="seq2seq: generate exactly --max-output-len tokens "
                   "(random weights never produce a meaningful end token)")
    p.add_argument("--save", default=None, metavar="DIR", help="write each output as DIR/NAME.npy")
    p.add_argument("--json", action="store_true", help="print the outputs as JSON lists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lazybatch.batcher.errors import ConfigError
    from lazybatch.client.api import Client

    url = args.url or ("127.0.0.1:8001" if args.protocol == "grpc" else "127.0.0.1:8000")
    with Client(url, args.protocol) as c:
        if not c.is_ready():
            raise ConfigError(f"no ready Triton server at {url} ({args.protocol}); start one with `lazybatch serve`")
        from lazybatch.client.seq2seq import info_from_parameters, make_request

        info = info_from_parameters(c.model_parameters(args.model))
        if info is not None:
            if args.ignore_eos and args.max_output_len is None:
                raise ConfigError("--ignore-eos needs --max-output-len (how many tokens to generate)")
            inputs = make_request(np.random.default_rng(args.seed), info, args.src_len or info.max_source_length,
                                  args.max_output_len, batch=args.batch, ignore_eos=args.ignore_eos)
        else:
            inputs = c.random_inputs(args.model, args.batch, args.seed)
        for item in args.input:
            name, eq, path = item.partition("=")
            if not eq:
                raise ConfigError(f"--input expects NAME=FILE.npy, got {item!r}")
            try:
                inputs[name] = np.load(path)
            except OSError as e:
                raise ConfigError(f"cannot read {path}: {e}") from None
        outputs, seconds = c.timed_infer(args.model, inputs, sla_ms=args.sla_ms, priority=args.priority)
    print(f"{args.model}: {seconds * 1e3:.2f} ms over {args.protocol}")
    for name, arr in outputs.items():
        if args.json or info is not None:  # seq2seq: the token lists themselves
            print(json.dumps({name: arr.tolist()}))
            continue
        flat = arr.reshape(arr.shape[0], -1)
        top = [int(i) for i in flat.argmax(axis=1)]
        print(f"  {name}: shape {list(arr.shape)} {arr.dtype}, argmax per sample {top}, "
              f"first values {np.array2string(flat[0, :5], precision=5)}")
        if args.save:
            Path(args.save).mkdir(parents=True, exist_ok=True)
            np.save(Path(args.save) / f"{name}.npy", arr)
    return 0
