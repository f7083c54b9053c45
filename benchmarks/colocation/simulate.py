"""The simulated ceiling beside each served cell: the same arrivals (each model's Poisson offsets and, for a decoder,
its drawn lengths, as `lazybatch load` drew them from the same seeds) on a virtual clock, every model on the latency
table its lazybatch configuration reads, shared as lazybatch/simulator/colocated.py models it: lazybatch's
``SharedDevice`` (``device``), processor sharing (``ps``: Triton's per-model backends with nothing across them) or
one token per whole execution (``token``: Triton's rate limiter), or weighted processor sharing (``wps``: the CPU
share's nice values aimed perfectly, its ceiling). No serving cost; the ps and token figures
beside the served Triton 0 ms and Triton + rate limiter are the check of those models against served figures."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from benchmarks.colocation.drive import pooled, summarise

# served configuration -> (policy on the table, how the device is shared)
SIM_OF = {"lazybatch": ("eager", "device"), "lazybatch_1lane": ("eager", "device"),  # one lane: the rule's ceiling
          "lazybatch_nodevice": ("eager", "ps"),
          "triton_0us": ("graph:0", "ps"), "triton_5000us": ("graph:5", "ps"),
          "triton_20000us": ("graph:20", "ps"), "triton_0us_rl": ("graph:0", "token"),
          "triton_0us_twin": ("graph:0", "ps"), "eager_shared": ("eager", "wps"), "lazybatch_share": ("eager", "wps"),
          # the large model's stub at a nice by hand: a weight matters only while both run, so it is wps's
          "hand_nice": ("graph:0", "wps")}


class Tables:
    """Each kind's latency table (the lazybatch model's) and, for a decoder, its histogram and length limits."""

    def __init__(self, tables: Mapping[str, Path]) -> None:
        from lazybatch.backend.config_pbtxt import load_config
        from lazybatch.batcher.latency_table import LatencyTable
        from lazybatch.batcher.lengths import LengthHistogram
        from lazybatch.client.seq2seq import info_from_parameters
        from lazybatch.formats.histograms import shipped_histogram

        self.table, self.info, self.hist = {}, {}, {}
        for kind, path in tables.items():
            self.table[kind] = LatencyTable.load(path)
            cfg = load_config(Path(path).parent.parent / "config.pbtxt")
            info = info_from_parameters({k: v.string_value for k, v in cfg.parameters.items()})
            self.info[kind] = info
            self.hist[kind] = None if info is None else LengthHistogram.load(shipped_histogram(info.length_histogram))


def arrivals(tables: Tables, kind: str, rate: float, duration: float, stream_seed: int, sla_ms: float) -> list:
    """The requests ``_run_one_rate`` sends for one model's stream seed: its offsets and, for a decoder, its
    source and output lengths (the load generator's LengthSampler with the same seed)."""
    from lazybatch.batcher.request import Request
    from lazybatch.client.load import poisson_schedule
    from lazybatch.client.seq2seq import LengthSampler

    offsets = poisson_schedule(rate, duration, stream_seed, 100_000)
    info = tables.info[kind]
    sampler = LengthSampler(info, None, stream_seed) if info is not None else None
    out = []
    for i, t in enumerate(offsets):
        enc, dec = sampler.draw() if sampler is not None else (1, None)
        out.append(Request(i, t, sla=sla_ms / 1e3, enc_steps=enc, dec_steps=dec))
    return out


def simulate(tables: Tables, config: str, rates: Mapping[str, float], duration: float, seed: int,
             slas: Mapping[str, float], t1s: Mapping[str, float], *, indices: Mapping[str, int] | None = None,
             levels: Mapping[str, int] | None = None, roles: Mapping[str, str] | None = None) -> dict:
    """One served cell replayed: ``rates`` (kind -> requests/s) with the stream seeds `lazybatch load --together`
    used (``model_seed(seed, index)``, index the kind's place among the models driven together, or ``indices``),
    each model under ``config``'s policy and sharing; ``levels``: device priority levels (``device`` only);
    ``roles``: the CPU share's declared roles (``wps`` only; a model left out is ``auto``). Returns
    the cell's summary (drive.summarise) against the served SLAs and t1s."""
    from lazybatch.batcher.cpu_rank import AUTO, ShareMember
    from lazybatch.batcher.decisions import DecisionLog
    from lazybatch.batcher.device import SharedDevice
    from lazybatch.batcher.policies.spec import parse_policy
    from lazybatch.batcher.request import Status
    from lazybatch.client.together import model_seed
    from lazybatch.simulator.colocated import ColocatedSimulation, Tenant

    policy, sharing = SIM_OF[config]
    tenants, reqs = [], {}
    for i, (kind, rate) in enumerate(rates.items()):
        idx = (indices or {}).get(kind, i)
        reqs[kind] = arrivals(tables, kind, rate, duration, model_seed(seed, idx), slas[kind])
        pol = parse_policy(policy).build(max_batch_size=tables.table[kind].max_batch_size,
                                         length_histogram=tables.hist[kind])
        tenants.append(Tenant(kind, tables.table[kind], pol, reqs[kind], priority=(levels or {}).get(kind, 0),
                              share=ShareMember(kind, sla_ms=slas[kind], role=(roles or {}).get(kind, AUTO)),
                              log=DecisionLog(capacity=1, enabled=False)))
    tenants = [t for t in tenants if t.requests]
    if not tenants:
        return {}
    ColocatedSimulation(tenants, sharing=sharing, device=SharedDevice() if sharing == "device" else None).run()
    lat = {k: [(r.finish - r.arrival) * 1e3 for r in rs if r.finish is not None and r.status == Status.OK]
           for k, rs in reqs.items()}
    per = {}
    for k, rs in reqs.items():
        span = max([r.finish for r in rs if r.finish is not None] + [duration]) if rs else duration
        per[k] = summarise(lat[k], len(rs), slas[k], t1s[k], len(lat[k]) / span if span > 0 else 0.0, rates[k])
    return {"models": per, "all": pooled(per, lat, slas, t1s), "sharing": sharing, "policy": policy}
