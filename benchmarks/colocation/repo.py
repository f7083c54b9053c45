"""The co-location benchmark's two model repositories, each configuration a set of the same four models.

One tritonserver serves every configuration without Triton's rate limiter (only one configuration is driven at a
time, the others' stubs sit idle); the rate-limited configurations need a server of their own, started with
``--rate-limit=execution_count``, because the rate limiter is a server-wide switch. Every lazybatch model names its
``device_group`` explicitly (``"none"`` for the configuration without the device scheduler), so the benchmark
measures the same thing whether or not the backend groups models by default; ``lazybatch`` takes the group's other
defaults (two lanes, each model's pool the cores divided among them: what a user who names a group gets), and
``lazybatch_1lane`` names one lane. Likewise every lazybatch model names its ``cpu_share``: ``"none"`` except under
``lazybatch_share`` (``"auto"``: the kernel's preemption aimed by the SLAs' rank, docs/colocation.md).

A run serves one lineup (``LINEUPS``): the configurations it measures and the one whose goals it judges, the others
shown beside it.

Configuration -> (model suffix, policy, config parameters, rate limiter priority or None):
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lazybatch.shipped import KIND_MAX_BATCH, SEQ2SEQ_KINDS, build_default_repository

GROUP = "colocated"     # the sweep's and the pair's device group
GROUP_1LANE = "colocated1"  # the same, one lane (device_lanes is one value per group: a group of its own)
PRIO_GROUP = "prio"     # the priority experiment's group (its models carry priority levels)
# the device scheduler's defaults are two lanes with the cores shared among them (one onnxruntime thread per model
# here); one lane with every core per model, the default before, is measured beside them (docs/colocation.md "Lanes")
ONE_LANE_PARAMS = {"device_lanes": "1"}
RL_PRIORITY = 1         # Triton's rate limiter priority of every model in the sweep: no preference among them
RL_BEST_EFFORT = 10     # ... and of the best-effort models in the priority experiment (the urgent one keeps 1):
                        # Triton's priority is a weight, priority 10 gets a tenth of priority 1's scheduling chances


@dataclass(frozen=True)
class Config:
    """One configuration: its models are ``<kind>_<suffix>``; ``params(kind)`` its extra config.pbtxt
    parameters; ``rl_priority(kind)`` its rate limiter priority (None: no rate limiter, the main server)."""

    suffix: str
    policy: str
    params: Callable[[str], dict[str, str]] = field(default=lambda kind: {})
    rl_priority: Callable[[str], int] | None = None

    @property
    def rate_limited(self) -> bool:
        return self.rl_priority is not None


def _group(name: str, extra: dict[str, str] | None = None, share: str = "none") -> Callable[[str], dict[str, str]]:
    return lambda kind: {"device_group": name, "cpu_share": share, **(extra or {})}


# the sweep's configurations (every model of the four under one of them), in the order the page lists them
CONFIGS: dict[str, Config] = {
    "lazybatch": Config("lazybatch", "eager", _group(GROUP)),
    "lazybatch_1lane": Config("lazybatch_1lane", "eager", _group(GROUP_1LANE, ONE_LANE_PARAMS)),
    "lazybatch_nodevice": Config("lazybatch_nodevice", "eager", _group("none")),
    "lazybatch_share": Config("lazybatch_share", "eager", _group("none", share="auto")),
    "triton_0us": Config("triton_0us", "triton:0"),
    "triton_5000us": Config("triton_5000us", "triton:5000"),
    "triton_20000us": Config("triton_20000us", "triton:20000"),
    "triton_0us_rl": Config("triton_0us_rl", "triton:0", rl_priority=lambda kind: RL_PRIORITY),
    # an identical copy of triton_0us, measured in turn like the others: the noise floor
    "triton_0us_twin": Config("triton_0us_twin", "triton:0"),
}
OURS = "lazybatch"  # the device scheduler at its defaults (two lanes): what the page's goals judge
ONE_LANE = "lazybatch_1lane"  # the device scheduler with one lane: judged beside it
DEFAULT = "lazybatch_nodevice"  # what a model gets without device_group: judged beside it (the shipped default)
SHARE = "lazybatch_share"  # the CPU share on, no device group
TWIN = "triton_0us_twin"
JUDGED = (OURS, ONE_LANE, DEFAULT, SHARE, TWIN)  # every configuration whose ratios to best Triton a page shows
TRITON = [c for c in CONFIGS if c.startswith("triton") and c != TWIN]  # "best Triton" is chosen among these


@dataclass(frozen=True)
class Lineup:
    """What one run measures: ``configs`` (in the order they take turns and the page lists them), ``ours`` the one
    whose goals it judges (every other one of JUDGED shown beside it), ``title`` the page's."""

    ours: str
    configs: tuple[str, ...]
    title: str

    @property
    def beside(self) -> list[str]:
        return [c for c in JUDGED if c != self.ours and c in self.configs]


_TRITONS = ("triton_0us", "triton_5000us", "triton_20000us", "triton_0us_rl", TWIN)
LINEUPS = {
    # the device scheduler (a non-preemptive accelerator's model) against Triton: docs/results/colocation.md
    "device": Lineup(OURS, (OURS, ONE_LANE, DEFAULT) + _TRITONS, "Many models, one device: served"),
    # the CPU share (the kernel's preemption, aimed) against Triton: docs/results/cpu_share_mix.md
    "cpu_share": Lineup(SHARE, (SHARE, DEFAULT) + _TRITONS, "Many models, one CPU shared through the kernel: served"),
}


def prio_configs(urgent: str) -> dict[str, Config]:
    """The priority experiment: ``urgent`` at the most urgent level, the others best effort, as a user would say it
    to each: lazybatch's ``device_priority_level`` (0 urgent, 1 best effort), the CPU share's role
    (``latency_critical``, ``best_effort``) and Triton's rate limiter priority."""
    return {
        "lazybatch": Config("lazybatch_prio", "eager", lambda kind: {
            "device_group": PRIO_GROUP, "cpu_share": "none", "device_priority_level": "0" if kind == urgent else "1"}),
        ONE_LANE: Config("lazybatch_1lane_prio", "eager", lambda kind: {
            "device_group": PRIO_GROUP + "1", "cpu_share": "none",
            "device_priority_level": "0" if kind == urgent else "1", **ONE_LANE_PARAMS}),
        SHARE: Config("lazybatch_share_prio", "eager", lambda kind: {
            "device_group": "none", "cpu_share": "latency_critical" if kind == urgent else "best_effort"}),
        "triton_0us": CONFIGS["triton_0us"],
        "triton_0us_rl": Config("triton_0us_rlprio", "triton:0",
                                rl_priority=lambda kind: RL_PRIORITY if kind == urgent else RL_BEST_EFFORT),
    }


def model_name(kind: str, cfg: Config) -> str:
    return f"{kind}_{cfg.suffix}"


def build(out: Path, kinds: list[str], configs: list[Config], *, profile_reps: int = 5, reprofile: bool = False,
          log: Callable[[str], None] = print) -> tuple[Path, Path]:
    """The main and the rate-limited repository under ``out`` with ``kinds`` under every configuration (each
    kind split and profiled once, in ``out/build``; a repository kept from an earlier run is reused, its configs
    rewritten; ``reprofile``: its latency tables measured again, on this machine now). Returns (main, rate-limited)."""
    from lazybatch.backend.config_pbtxt import config_to_text, load_config

    main, limited = out / "repo", out / "repo_rl"
    for kind in kinds:
        for repo, cfgs in ((main, [c for c in configs if not c.rate_limited]),
                           (limited, [c for c in configs if c.rate_limited])):
            if not cfgs:
                continue
            # a decoder under Triton's own batcher (each group decoded to its end in one execute), as a user of
            # Triton serves it, not the backend's graph batching that stands in for it elsewhere
            build_default_repository(repo, kind=kind, work=out / "build" / kind, profile_reps=profile_reps,
                                     policies={c.suffix: c.policy for c in cfgs}, seq2seq_baselines=False,
                                     reprofile=reprofile and repo == main, log=lambda s: None)
            for c in cfgs:
                path = repo / model_name(kind, c) / "config.pbtxt"
                cfg = load_config(path)
                for key in ("device_group", "device_priority_level", "cpu_share"):
                    if key in cfg.parameters:
                        del cfg.parameters[key]
                for k, v in c.params(kind).items():
                    cfg.parameters[k].string_value = v
                if c.rl_priority is not None:
                    rl = cfg.instance_group[0].rate_limiter
                    rl.Clear()
                    res = rl.resources.add(name="device", count=1)
                    setattr(res, "global", True)  # one copy for the whole server: the one device
                    rl.priority = c.rl_priority(kind)
                path.write_text(config_to_text(cfg))
        log(f"[build] {kind}: {len(configs)} configurations")
    for repo, cfgs in ((main, [c for c in configs if not c.rate_limited]),
                       (limited, [c for c in configs if c.rate_limited])):
        _prune(repo, {model_name(k, c) for k in kinds for c in cfgs}, log)
    return main, limited


def _prune(repo: Path, wanted: set[str], log: Callable[[str], None]) -> None:
    """Remove the models of a kept repository that no configuration of this run names (a configuration renamed or
    dropped since it was built): tritonserver would load them too, and 8 idle stubs took 5 GB at 73fc393."""
    import shutil

    if not repo.is_dir():
        return
    stale = sorted(d.name for d in repo.iterdir() if d.is_dir() and (d / "config.pbtxt").exists()
                   and d.name not in wanted)
    for name in stale:
        shutil.rmtree(repo / name)
    if stale:
        log(f"[build] removed {len(stale)} models of {repo.name} that this run does not serve: {', '.join(stale)}")


def lazybatch_table(out: Path, kind: str, ours: str = OURS) -> Path:
    """The latency table the lazybatch models of ``kind`` read (the simulator's too): ``ours``'s copy."""
    return out / "repo" / f"{kind}_{CONFIGS[ours].suffix}" / "1" / "latency.json"


def is_decoder(kind: str) -> bool:
    return kind in SEQ2SEQ_KINDS


def max_batch(kind: str) -> int:
    return KIND_MAX_BATCH[kind]
