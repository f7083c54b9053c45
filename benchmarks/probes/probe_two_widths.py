"""What stage sessions at two widths would cost a grouped model (docs/colocation.md: a member alone runs its one-stage jobs
at the lane's one onnxruntime thread, because onnxruntime cannot resize a session's pool; a second set of stage
sessions at every core would run them wide while it is alone).

    python -m benchmarks.probes.probe_two_widths                 # MobileNet and BERT, the co-location build
    python -m benchmarks.probes.probe_two_widths --json docs/data/two_widths.json

Each variant in a process of its own (its memory measured alone): the model's stage sessions at one thread, at two,
both sets each with its own weights (``twice``), and both sets sharing one copy of the weights
(``SessionOptions.add_initializer`` with the same OrtValues; onnxruntime's prepacked copies cannot be shared from
Python, so prepacking is off in that variant, ``shared``). Per variant: the resident memory the sessions added
(after ``malloc_trim``), and the median time of a batch-1 pass through the stages at each width. Spinning is off in
every session, as in a grouped stub. A probe, not a results page: it prints and writes ``--json``."""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

VARIANTS = ("one_thread", "two_threads", "twice", "shared")


def _rss_mib() -> float:
    from lazybatch.client.soak import process_rss

    return process_rss(os.getpid()) / 2**20


def _trim() -> None:
    from lazybatch.backend.memory import malloc_trim

    gc.collect()
    malloc_trim()


def measure(stages: Path, variant: str, passes: int = 40) -> dict:
    """One variant, in this process: the memory its sessions added and the pass time at each width."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from lazybatch.onnx_tools.profile import call_times
    from lazybatch.sessions.chain import random_feeds

    manifest = json.loads((stages / "manifest.json").read_text())
    files = [stages / s["file"] for s in manifest["stages"]]
    _trim()
    base = _rss_mib()
    shared: list[dict] = []
    if variant == "shared":  # one copy of the weights, owned here, handed to both widths' sessions
        for f in files:
            model = onnx.load(str(f))
            shared.append({i.name: ort.OrtValue.ortvalue_from_numpy(numpy_helper.to_array(i))
                           for i in model.graph.initializer})
            del model

    def build(threads: int) -> list:
        out = []
        for k, f in enumerate(files):
            o = ort.SessionOptions()
            o.intra_op_num_threads, o.inter_op_num_threads = threads, 1
            o.add_session_config_entry("session.intra_op.allow_spinning", "0")
            if shared:
                o.add_session_config_entry("session.disable_prepacking", "1")
                for name, value in shared[k].items():
                    o.add_initializer(name, value)
            out.append(ort.InferenceSession(str(f), o, providers=["CPUExecutionProvider"]))
        return out

    widths = {"one_thread": (1,), "two_threads": (2,)}.get(variant, (1, 2))
    sets = {w: build(w) for w in widths}
    _trim()
    added = _rss_mib() - base
    first = random_feeds(manifest["graph_inputs"], 1, np.random.default_rng(0))
    pass_ms = {}
    for w, sessions in sets.items():
        def chain() -> None:
            feeds = dict(first)
            for s in sessions:
                names = [o.name for o in s.get_outputs()]
                feeds.update(zip(names, s.run(names, {i.name: feeds[i.name] for i in s.get_inputs()})))
        pass_ms[str(w)] = float(np.median(call_times(chain, 5, passes))) * 1e3
    return {"variant": variant, "rss_added_mib": added, "pass_ms": pass_ms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mobilenet,bert")
    ap.add_argument("--build", default="lazybatch-results/colocation/build",
                    help="the co-location benchmark's split models (<build>/<kind>/<kind>_stages)")
    ap.add_argument("--rounds", type=int, default=3, help="processes per variant (3)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", nargs=2, metavar=("STAGES", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:  # a child: one variant, its figures on stdout
        print(json.dumps(measure(Path(args.one[0]), args.one[1])))
        return 0
    from benchmarks.harness import command_line, machine_meta, write_json

    res: dict = {"meta": {**machine_meta(), "command": command_line()}, "rows": []}
    for kind in args.models.split(","):
        stages = Path(args.build) / kind / f"{kind}_stages"
        if not (stages / "manifest.json").exists():
            ap.error(f"no split model at {stages}: run the co-location benchmark (or --quick) first")
        for r in range(args.rounds):
            for v in VARIANTS:
                out = subprocess.run([sys.executable, "-m", "benchmarks.probes.probe_two_widths", "--one",
                                      str(stages), v], capture_output=True, text=True, check=True)
                row = {"model": kind, "round": r, **json.loads(out.stdout.strip().splitlines()[-1])}
                res["rows"].append(row)
                print(f"{kind} round {r} {v}: +{row['rss_added_mib']:.0f} MiB, pass ms "
                      + ", ".join(f"{w} thread(s) {t:.1f}" for w, t in row["pass_ms"].items()), flush=True)
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
