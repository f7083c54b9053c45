"""The co-located pair (docs/colocation.md), its parts: the measurement, the options and the page of
``python -m benchmarks.pair``.

    python -m benchmarks.pair                     # serves model_repository (built with `lazybatch repo default --pair`)

The small model (the 8 x 2048 MLP) gets Poisson arrivals at ``--small-load`` of its batch-1 rate (0.3), the large
one (ResNet-50) at ``--large-load`` of its own (1.1), both at once (client/together.py, ``lazybatch load
--together``'s code). Configurations: lazybatch's default policy with the CPU share on (``<kind>_eager_shared``,
``cpu_share: auto``, the default: no parameter in its config), under which the large model's threads yield the cores while the small one, with the shorter SLA, has
requests: backend/cpu_share.py), Triton's dynamic batcher at 0 ms and 5 ms (``<kind>_triton_0us``,
``<kind>_triton_5000us``: two backend processes sharing the cores as the kernel shares them by default), Triton 0
ms with each model pinned to cores of its own (PINNED, host policies), and each model alone under lazybatch and under Triton 0 ms (the same arrivals with nothing beside it). Every
repetition runs every configuration, in an order that turns by one each repetition, with that repetition's seeded
arrivals.

The verdict (benchmarks/harness/verdict.py): per repetition, the best Triton configuration's figure / lazybatch's,
Triton's best chosen on the other repetitions (harness.held_out_ratios); the interval is the range over the
repetitions, and a range across the goal is a tie. Short runs: these are a new user's first look, not the results
page's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from benchmarks.harness import geomean, held_out_ratios, judge
from benchmarks.harness.cli import turned
from benchmarks.harness.measure import service_time
from benchmarks.harness.page import table_head
from benchmarks.harness.stats import percentile
from benchmarks.harness.procs import cores, niced, processes, watched_nices
from lazybatch.backend.arbiter.protocol import SIBLING_WINDOW_S
from lazybatch.backend.cpu_share import ACTIVE_WINDOW_S, POLL_S
from lazybatch.client.api import Client
from lazybatch.client.load import LoadResult, run_load
from lazybatch.client.together import model_seed, run_together
from lazybatch.shipped import KIND_SLA_MS, PAIR_KINDS, PAIR_OURS, PAIR_POLICIES

ROLES = ("small", "large")
TRITON = [s for s in PAIR_POLICIES if s.startswith("triton_")]
# (figure, lower is better for us as a ratio best Triton / lazybatch: higher is better) -> its goal (docs/colocation.md)
# the large model's: its average at most 1.1x higher than under Triton's best (1 / 1.1)
GOALS = {("small", "avg_ms"): 2.0, ("small", "p99_ms"): 2.5, ("large", "avg_ms"): round(1 / 1.1, 2)}
# the hand-set nice reference line (not a baseline): Triton 0 ms with every thread of the large model's stub at the
# CPU share's nice for the whole run, set from outside (harness.procs.niced): the lever without the aiming. Against
# it lazybatch should be level on the small model and ahead on the large one (docs/colocation.md)
HAND_NICE = "hand_nice"
HAND_BASE = "triton_0us"  # whose models it drives
REFERENCE_GOALS = {("small", "avg_ms"): 0.95, ("large", "avg_ms"): 1.0}
# the noise floor: an identical copy of Triton 0 ms (its models served from a repository of their own), judged in
# lazybatch's place by the same rule; any verdict but a tie against 1.00 is a false one
TWIN = "triton_0us_twin"
# Triton's own answer to co-location on a CPU: host policies that pin each model's instances to cores of its own
# (``--host-policy=NAME,cpu-cores=LO-HI``, the model's ``instance_group { host_policy: NAME }``); the stub inherits its
# instance thread's affinity. The small model on core 0, the large one on the others: one core each on two. A Triton
# baseline like the others (best Triton is chosen among them), served from the copies' repository
PINNED = "triton_0us_pinned"
PIN_POLICY = {"small": "lazybatch_pair_small", "large": "lazybatch_pair_large"}
ALONE_GOAL = 1.3  # the small model beside the large one within 1.3x of its latency alone (docs/colocation.md)
# between configurations: past the CPU share's window (and the device lease's sibling window, for grouped models),
# so that a model measured "alone" right after the other model's turn is alone for them too (0.3 s once left a
# grouped model within the lease's window: one-stage jobs for 0.7 s)
PAUSE_S = max(SIBLING_WINDOW_S, ACTIVE_WINDOW_S + POLL_S) + 0.2
# before the repetitions, each configuration's pair runs this long unrecorded: the first seconds after a load
# (onnxruntime's arenas growing to the large model's batches) were up to 2x slower for every configuration
WARMUP_S = 1.0


def measure(url: str, prefixes: dict[str, str], *, small_load: float = 0.3, large_load: float = 1.1,
            duration_s: float = 2.0, reps: int = 3, seed: int = 0, slas: dict[str, float] | None = None,
            configs: Sequence[str] = (PAIR_OURS, *TRITON), alone: Sequence[str] | None = None,
            calibration: dict[str, int] | None = None, pause_s: float = PAUSE_S, warmup_s: float = WARMUP_S,
            server_pid: int | None = None, hand_nice: int | None = None, twin: bool = False,
            pinned: bool = False, progress: Callable[[str], None] = print) -> dict:
    """Run the pair on the server at ``url`` (gRPC); returns the raw data (``score`` and ``markdown`` read it).
    ``prefixes``: role -> the model name's prefix (a model is ``<prefix>_<suffix>``, suffixes ``configs``, the
    first lazybatch's); ``alone``: the configurations each model also runs alone in (default lazybatch's and Triton
    0 ms: what grouping costs a model alone, and what the other model costs it under each); ``slas``: role -> SLA in
    ms, sent with lazybatch's requests (default the kinds'). With ``server_pid`` (the tritonserver's), every run
    records the nice values its stubs' threads took (``stub_nices``, from /proc), and ``hand_nice`` adds the
    reference line HAND_NICE at that nice. ``twin``: the server also serves ``<prefix>_triton_0us_twin`` models,
    run as the noise floor TWIN; ``pinned``: ``<prefix>_triton_0us_pinned`` models (build_pinned, the server started
    with pinning_args), run as the Triton baseline PINNED."""
    if pinned and "triton_0us" in configs and can_pin():
        configs = (*configs, PINNED)
    if twin and "triton_0us" in configs:
        configs = (*configs, TWIN)
    if hand_nice is not None and server_pid is not None and HAND_BASE in configs:
        configs = (*configs, HAND_NICE)
    names = {(role, cfg): f"{prefixes[role]}_{HAND_BASE if cfg == HAND_NICE else cfg}"
             for role in ROLES for cfg in configs}
    slas = slas or {role: KIND_SLA_MS.get(PAIR_KINDS[role], 100.0) for role in ROLES}
    ours = configs[0]
    # batch-1 service times after warm-up, whose median sets the loads: ResNet-50's, over 15 calls, read 27-56 ms
    # from run to run on one machine. More calls narrow the median's sampling; the machine's own drift remains,
    # so each run is at the load point its meta records, the same for every configuration of that run
    cal = calibration or {"small": 200, "large": 40}
    began = time.monotonic()
    with Client(url) as c:
        t1_s = {role: service_time(c, names[(role, "triton_0us")] if (role, "triton_0us") in names else names[(role, ours)],
                         cal[role]) for role in ROLES}
    rates = {"small": small_load / t1_s["small"], "large": large_load / t1_s["large"]}
    progress(f"pair: t1 small {t1_s['small'] * 1e3:.1f} ms, large {t1_s['large'] * 1e3:.1f} ms; rates "
             f"{rates['small']:.1f}/s and {rates['large']:.1f}/s, {reps} x {duration_s:g} s per configuration")
    alone = [c for c in (alone if alone is not None else (ours, "triton_0us")) if c in configs]
    turns = [("together", cfg) for cfg in configs] + [("alone", (role, cfg)) for cfg in alone for role in ROLES]
    def together(cfg: str, seconds: float, k: int) -> list[LoadResult]:
        pair = {names[(role, cfg)]: rates[role] for role in ROLES}
        total = sum(pair.values())
        return run_together(url, {m: r / total for m, r in pair.items()}, total, seconds,
                            sla_ms={names[(role, cfg)]: slas[role] for role in ROLES}, seed=seed + k,
                            timeout_s=60.0, send_sla=cfg == ours)

    def stubs(cfg: str, roles: Sequence[str]) -> dict[str, int]:
        procs = processes(server_pid) if server_pid is not None else {}
        return {role: procs[names[(role, cfg)]] for role in roles if names[(role, cfg)] in procs}

    def hand_set(cfg: str):
        return niced(stubs(cfg, ["large"]).values(), hand_nice) if cfg == HAND_NICE else contextlib.nullcontext()

    if warmup_s > 0:
        for cfg in configs:
            with hand_set(cfg):
                together(cfg, warmup_s, 10_000)  # arrivals of their own, not a repetition's
            time.sleep(pause_s)
    runs: list[dict] = []
    for k in range(reps):
        for mode, what in turned(turns, k):
            cfg = what[1] if mode == "alone" else what
            with hand_set(cfg if mode == "together" else ""), watched_nices(stubs(cfg, ROLES)) as nices:
                if mode == "together":
                    results = dict(zip(ROLES, together(what, duration_s, k)[:2]))
                else:
                    role = what[0]
                    results = {role: run_load(url, names[(role, cfg)], rates[role], duration_s, sla_ms=slas[role],
                                              seed=model_seed(seed + k, ROLES.index(role)), timeout_s=60.0,
                                              send_sla=cfg == ours)}
            for role, r in results.items():
                runs.append(row(r, rep=k, mode=mode, config=cfg, role=role,
                                **({"stub_nices": sorted(nices[role])} if role in nices else {})))
                progress(f"  rep {k} {mode:<8} {r.model:<24} sent {r.sent} ok {r.ok} avg {r.avg_ms:.1f} "
                         f"p99 {r.p99_ms:.1f} ms")
            time.sleep(pause_s)
    procs = processes(server_pid) if server_pid is not None else {}
    affinity = {f"{role} {cfg}": cores(procs[names[(role, cfg)]]) for role in ROLES for cfg in configs
                if names[(role, cfg)] in procs}  # the CPUs each stub may run on, from /proc
    return {"meta": {"prefixes": prefixes, "configs": list(configs), "alone": alone, "hand_nice": hand_nice,
                     "stub_cores": affinity,
                     "t1_ms": {r: v * 1e3 for r, v in t1_s.items()},
                     "rates": rates, "loads": {"small": small_load, "large": large_load}, "slas_ms": slas,
                     "duration_s": duration_s, "reps": reps, "seed": seed, "warmup_s": warmup_s,
                     "elapsed_s": round(time.monotonic() - began, 1),
                     "loadavg": " ".join(f"{v:.1f}" for v in os.getloadavg())},
            "runs": runs}


def row(r: LoadResult, **key: object) -> dict:
    return {**key, "model": r.model, "start_unix": r.start_unix, "sent": r.sent, "ok": r.ok, "errors": r.errors,
            "avg_ms": r.avg_ms,
            "p99_ms": r.p99_ms, "latencies_ms": [round(v, 3) for v in r.latencies_ms]}


def pooled(runs: list[dict]) -> dict:
    """Repetitions of one model in one configuration: counts summed, avg and p99 over every answer."""
    lat = np.array([v for r in runs for v in r["latencies_ms"]], dtype=float)
    return {"sent": sum(r["sent"] for r in runs), "errors": sum(r["errors"] for r in runs),
            "avg_ms": float(lat.mean()) if lat.size else math.nan,
            "p99_ms": percentile(lat, 99)}


def per_rep(data: dict, mode: str, config: str, role: str, key: str) -> list[float]:
    runs = sorted((r for r in data["runs"] if (r["mode"], r["config"], r["role"]) == (mode, config, role)),
                  key=lambda r: r["rep"])
    return [r[key] for r in runs]


def score(data: dict) -> list[dict]:
    """The verdict rows: per figure of GOALS, best Triton / lazybatch per repetition (held out), its geometric mean
    and range, judged against 1.00 (lazybatch lower) and against the co-location goal; then the small model beside the
    large one / alone, under lazybatch, against ALONE_GOAL."""
    configs = data["meta"]["configs"]
    ours, tri = configs[0], [c for c in configs[1:] if c not in (HAND_NICE, TWIN)]
    out = []
    for (role, key), goal in GOALS.items():
        ratios, picks = held_out_ratios({c: per_rep(data, "together", c, role, key) for c in tri},
                                        per_rep(data, "together", ours, role, key))
        out.append(verdict_row(f"{role} {key.removesuffix('_ms')}: best Triton / lazybatch", ratios, goal,
                               picks=picks))
    if TWIN in configs:  # the same ratios with the identical copy in lazybatch's place
        for (role, key), goal in GOALS.items():
            ratios, picks = held_out_ratios({c: per_rep(data, "together", c, role, key) for c in tri},
                                            per_rep(data, "together", TWIN, role, key))
            out.append(verdict_row(f"{role} {key.removesuffix('_ms')}: best Triton / its identical copy (noise "
                                   "floor)", ratios, goal, picks=picks))
    if HAND_NICE in configs:  # the reference line: the same lever set by hand, per repetition
        for (role, key), goal in REFERENCE_GOALS.items():
            ratios = [h / o for h, o in zip(per_rep(data, "together", HAND_NICE, role, key),
                                            per_rep(data, "together", ours, role, key)) if o > 0]
            out.append(verdict_row(f"{role} {key.removesuffix('_ms')}: hand-set nice (reference) / lazybatch",
                                   ratios, goal))
    alone = per_rep(data, "alone", ours, "small", "avg_ms")
    beside = per_rep(data, "together", ours, "small", "avg_ms")
    ratios = [b / a for a, b in zip(alone, beside) if a > 0]
    out.append(verdict_row("small avg under lazybatch: beside the large one / alone", ratios, ALONE_GOAL,
                           lower_is_better=True))
    return out


def verdict_row(figure: str, ratios: list[float], goal: float, *, lower_is_better: bool = False,
                picks: Sequence[str] = ()) -> dict:
    finite = [v for v in ratios if v > 0 and math.isfinite(v)]
    if not finite:
        return {"figure": figure, "ratio": math.nan, "lo": math.nan, "hi": math.nan, "goal": goal,
                "vs_one": "tie", "vs_goal": "tie", "picks": list(picks), "lower_is_better": lower_is_better}
    lo, hi = min(finite), max(finite)
    return {"figure": figure, "ratio": geomean(finite), "lo": lo, "hi": hi, "goal": goal,
            "vs_one": judge(lo, hi, 1.0, lower_is_better=lower_is_better),
            "vs_goal": judge(lo, hi, goal, lower_is_better=lower_is_better), "picks": list(picks),
            "lower_is_better": lower_is_better}


def markdown(data: dict) -> str:
    m = data["meta"]
    ours, configs = m["configs"][0], m["configs"]
    label = {ours: "lazybatch (CPU share)",
             **{c: f"Triton {int(c.removeprefix('triton_').removesuffix('us')) / 1000:g} ms" for c in configs[1:]
                if c.startswith("triton_") and c not in (TWIN, PINNED)},
             TWIN: "Triton 0 ms, identical copy (noise floor)",
             PINNED: "Triton 0 ms, a core each (host policies)",
             HAND_NICE: f"reference: Triton 0 ms, large at nice {m.get('hand_nice')} by hand"}
    lines = [f"Co-located pair on one tritonserver: small `{m['prefixes']['small']}` (t1 {m['t1_ms']['small']:.1f} "
             f"ms) at {m['loads']['small']:.0%} of its batch-1 rate ({m['rates']['small']:.1f}/s) beside large "
             f"`{m['prefixes']['large']}` (t1 {m['t1_ms']['large']:.1f} ms) at {m['loads']['large']:.0%} "
             f"({m['rates']['large']:.1f}/s), Poisson, both at once; {m['reps']} repetitions of {m['duration_s']:g} "
             "s per configuration, taking turns. Ratios: best Triton / lazybatch per repetition (Triton's best chosen "
             f"on the other repetitions), geometric mean [range]; a range across the goal is a tie. Load average "
             f"{m.get('loadavg', '?')}.", "",
             *table_head(["model", "configuration", "beside the other", "sent", "err", "avg ms", "p99 ms",
                          "its threads' nice (/proc)"])]
    for role in ROLES:
        cells = [("alone", c) for c in configs] + [("together", c) for c in configs]
        for mode, cfg in cells:
            runs = [r for r in data["runs"] if (r["mode"], r["config"], r["role"]) == (mode, cfg, role)]
            if not runs:
                continue
            p = pooled(runs)
            seen = sorted({n for r in runs for n in r.get("stub_nices", ())})
            lines.append(f"| {role} {runs[0]['model']} | {label[cfg]} | {'yes' if mode == 'together' else 'alone'} "
                         f"| {p['sent']} | {p['errors']} | {p['avg_ms']:.1f} | {p['p99_ms']:.1f} | "
                         f"{', '.join(map(str, seen)) or '-'} |")
    held = {cfg: sum(m["rates"][role] * pooled([r for r in data["runs"] if (r["mode"], r["config"], r["role"]) ==
                                                ("together", cfg, role)])["avg_ms"] / 1e3 for role in ROLES)
            for cfg in configs}
    lines += ["", "Requests held on average by both models together (Little's law: the sum of rate x average "
              "latency; a work-conserving reordering keeps it about equal): "
              + ", ".join(f"{label[c]} {held[c]:.1f}" for c in configs) + "."]
    lines += ["", *table_head(["figure", "ratio [range over repetitions]", "lazybatch lower (>= 1.00x)",
                               "goal", "verdict at the goal"])]
    for v in score(data):
        one = "-" if v["lower_is_better"] else v["vs_one"]
        sign = "<=" if v["lower_is_better"] else ">="
        lines.append(f"| {v['figure']} | {v['ratio']:.2f}x [{v['lo']:.2f}-{v['hi']:.2f}] | {one} | "
                     f"{sign} {v['goal']:g}x | {v['vs_goal']} |")
    return "\n".join(lines) + "\n"


def report(data: dict, out: Path, page: Path | None = None) -> str:
    """Write pair.json (raw, every latency) in ``out`` and the page (``page``, default ``out``/pair.md) and print
    the page; returns it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "pair.json").write_text(json.dumps(data, indent=1))
    text = markdown(data)
    if page is not None:  # a results page: its title, and where its data and design are
        text = ("# The CPU share, served on the quickstart's pair\n\nGenerated by `"
                + data["meta"].get("command", "python -m benchmarks.pair") + f"` at commit "
                f"{data['meta'].get('commit', '?')}; raw data in {out}/pair.json; design and discussion in "
                "[colocation.md](../colocation.md#the-cpu-through-the-operating-system).\n\n" + text)
    page = out / "pair.md" if page is None else Path(page)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    print(text, flush=True)
    return text


def add_args(ap: argparse.ArgumentParser) -> None:
    """The pair's options."""
    ap.add_argument("--duration", dest="pair_duration", type=float, default=2.0,
                    help="seconds of load per configuration and repetition (2)")
    ap.add_argument("--reps", dest="pair_reps", type=int, default=3, help="repetitions (3)")
    ap.add_argument("--small-load", dest="small_load", type=float, default=0.3,
                    help="the small model's load, a fraction of its batch-1 rate (0.3)")
    ap.add_argument("--large-load", dest="large_load", type=float, default=1.1, help="the large model's (1.1)")


def build_twins(twins: Path, repository: Path, kinds: Sequence[str] | None = None,
                pair: Mapping[str, str] = PAIR_KINDS) -> Path:
    """The noise floor's models (TWIN, an identical copy of Triton 0 ms) of ``kinds`` (default the pair's) in
    ``twins``, a repository of their own, from ``repository``'s builds (no new split or profile): the drop-in
    repository keeps only the models a user serves. The pinned baseline's models (PINNED) of the ``pair`` (role ->
    kind) go there too (build_pinned)."""
    from lazybatch.shipped import build_default_repository, default_build_dir

    for kind in pair.values() if kinds is None else kinds:
        build_default_repository(twins, kind=kind, work=default_build_dir(repository), policies={TWIN: "triton:0"},
                                 log=lambda line: None)
    return build_pinned(twins, repository, pair) if can_pin() else twins  # one core: no host policies to serve them


def build_pinned(copies: Path, repository: Path, kinds: Mapping[str, str] = PAIR_KINDS) -> Path:
    """PINNED's models in ``copies``: Triton 0 ms of each pair kind, its instance group under the host policy of its
    role (the server needs pinning_args)."""
    from lazybatch.backend.config_pbtxt import config_to_text, load_config
    from lazybatch.shipped import build_default_repository, default_build_dir

    for role, kind in kinds.items():
        build_default_repository(copies, kind=kind, work=default_build_dir(repository), policies={PINNED: "triton:0"},
                                 log=lambda line: None)
        path = copies / f"{kind}_{PINNED}" / "config.pbtxt"
        cfg = load_config(path)
        for group in cfg.instance_group:
            group.host_policy = PIN_POLICY[role]
        path.write_text(config_to_text(cfg))
    return copies


def pair_slas(kinds: Mapping[str, str]) -> dict[str, float]:
    """kind -> the SLA (ms) its pair models are built and driven with: the kinds' own (KIND_SLA_MS), but the small
    model's always the shorter, as the CPU share ranks the pair by it (the quickstart's pair: 10 and 100 ms)."""
    small, large = KIND_SLA_MS[kinds["small"]], KIND_SLA_MS[kinds["large"]]
    return {kinds["small"]: min(small, large / 2), kinds["large"]: large}


def can_pin(n_cores: int | None = None) -> bool:
    """Whether PINNED can run: a core for each model needs two."""
    return (n_cores or os.cpu_count() or 1) >= 2


def pinning_args(n_cores: int | None = None) -> list[str]:
    """tritonserver's flags for PINNED's host policies: core 0 for the small model, the rest for the large one;
    none on one core, where PINNED is left out (can_pin)."""
    n = n_cores or os.cpu_count() or 1
    if not can_pin(n):
        return []
    return [f"--host-policy={PIN_POLICY['small']},cpu-cores=0-0",
            f"--host-policy={PIN_POLICY['large']},cpu-cores=1-{n - 1}"]


def run_args(url: str, args: argparse.Namespace, server_pid: int | None = None, twin: bool = False,
             pinned: bool = False, kinds: Mapping[str, str] = PAIR_KINDS) -> dict:
    """The pair with the command line's options; with ``server_pid``, the stubs' nices recorded and, where this
    process may raise a thread back (CAP_SYS_NICE), the hand-set nice reference line at the CPU share's nice."""
    from lazybatch.backend.os_weights import Privileges
    from lazybatch.batcher.cpu_rank import NICE_STEPS

    hand = NICE_STEPS[1] if server_pid is not None and Privileges.probe().cap_sys_nice else None
    if server_pid is not None and hand is None:
        print("pair: no hand-set nice reference line: raising its threads back needs CAP_SYS_NICE (run as root)")
    return measure(url, dict(kinds), small_load=args.small_load, large_load=args.large_load,
                   duration_s=args.pair_duration, reps=args.pair_reps, seed=getattr(args, "seed", 0),
                   slas={role: pair_slas(kinds)[kind] for role, kind in kinds.items()},
                   server_pid=server_pid, hand_nice=hand, twin=twin, pinned=pinned)

