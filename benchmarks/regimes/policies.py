"""The policies a regimes run serves, how the page names and orders them, the models it knows, and a run's
settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lazybatch.batcher.policies.spec import parse_policy
from lazybatch.shipped import COMPARISON, SEQ2SEQ_BASELINES

# Every policy the backend serves, for evaluations that compare them all (the regimes sweep).
ALL_POLICIES = {**COMPARISON, "lazy": "lazy", "oracle": "oracle", "monitor": "monitor"}
ALL_POLICIES.update({k: v for k, v in SEQ2SEQ_BASELINES.values()})
# Variants: lazy with one knob set (a policy parameter or further config.pbtxt parameters), for evaluations that
# weigh that knob. lazy_fused: whole-graph passes (fuse_stages: true) whatever its batch cap, to measure what the
# stage boundaries cost and buy on a model where batching pays (fuse_stages: auto fuses only where it does not).
# lazy_inline: responses sent by the scheduler thread (response_thread: false), to measure the response thread.
# lazy_benefit: preemptions only where they also lower the summed latency (batcher/policies/lazy.py).
VARIANT_POLICIES: dict[str, tuple[str, dict[str, str]]] = {
    "lazy_fused": ("lazy", {"fuse_stages": "true"}),
    "lazy_inline": ("lazy", {"response_thread": "false"}),
    "lazy_benefit": ("lazy:preempt=benefit", {}),
    # eager's urgency rule on 4 merged segments (fuse_segments: 4), benchmarks/bench_mixed.py
    "eager_seg4": ("eager:urgency=true", {"fuse_segments": "4"}),
}
POLICY_PARAMETERS: dict[str, dict[str, str]] = {k: params for k, (_, params) in VARIANT_POLICIES.items()}


def parameters_for(names: "list[str] | dict[str, str]") -> dict[str, dict[str, str]]:
    """The config.pbtxt parameters of the variants among ``names`` (build_default_repository's ``parameters``)."""
    return {k: POLICY_PARAMETERS[k] for k in names if POLICY_PARAMETERS.get(k)}


ALL_POLICIES.update({k: policy for k, (policy, _) in VARIANT_POLICIES.items()})


# eager: the default of `repo add` and the quickstart (batcher/policies/eager.py); lazy: the paper's algorithm
POLICY_ORDER = ["eager", "lazy", "oracle", "serial", "triton_0us", "triton_5000us", "triton_20000us", "monitor"]
# Asked for by name only (--policies): a variant of a policy with one backend knob set (POLICY_PARAMETERS,
# above). A variant is not one of "all policies" in the goals: lazy is not judged against itself.
VARIANT_NOTES = {"lazy_fused": "whole-graph passes whatever the batch cap",
                 "lazy_inline": "responses sent by the scheduler thread",
                 "lazy_benefit": "preempts only where that also lowers the summed latency"}
VARIANTS = {v: ", ".join([ALL_POLICIES[v], *(f"{k}: {x}" for k, x in POLICY_PARAMETERS[v].items())])
            + f" ({note})" for v, note in VARIANT_NOTES.items()}  # the parameters as repo.py writes them
# per variant: what it measures, the unit of its backend-cost figure, how to read the ratios
VARIANT_WHY = {
    "lazy_fused": ("Stage boundaries, measured", "whole-graph pass",
                   "Above 1, the boundaries pay for themselves: a newcomer starts at the next boundary instead of "
                   "after the running pass, and sub-batches merge there; below 1, they cost more than they buy "
                   "(`fuse_stages: auto` fuses only where lazy's batch cap is 1)."),
    "lazy_inline": ("The response thread, measured", "stage",
                    "pb_utils' send waits for the Triton process to take each response (a round trip); above 1, "
                    "sending from a thread of its own (the default) saved the scheduler thread that wait."),
    "lazy_benefit": ("The preemption rule, measured", "stage",
                     "Below 1, refusing the preemptions that the latency table predicts to raise the summed latency "
                     "(late in a running sub-batch, or where a batch costs nearly its members' single runs) lowered "
                     "lazy's average; the simulated table below shows the same rule without serving cost."),
}
KNOWN_POLICIES = ["eager", "lazy", *VARIANTS, *POLICY_ORDER[2:]]
GRAPH = ["graph_0ms", "graph_5ms", "graph_20ms"]  # seq2seq: graph batching in the backend instead of Triton's
ROW_ORDER = KNOWN_POLICIES + GRAPH
LAZYBATCH_SCHEDULED = {"eager", "lazy", *VARIANTS, "oracle", "serial", "monitor", *GRAPH}  # our scheduler (stats)


def sla_aware(name: str) -> bool:
    """Whether a served policy's requests carry the SLA target: what its spec says (PolicySpec.sla_aware); Triton's
    own batcher (triton:<us>, no lazybatch policy) never reads one."""
    text = ALL_POLICIES[name]
    return not text.startswith("triton:") and parse_policy(text).sla_aware


SLA_AWARE = {p for p in KNOWN_POLICIES if sla_aware(p)}  # eager, lazy, its variants, oracle
TRITON = ["triton_0us", "triton_5000us", "triton_20000us"]
SEQ2SEQ_KINDS = {"gnmt"}
DESCRIPTION = {
    "mlp": "8-layer MLP, width 2048 (matrix-vector bound at batch 1)",
    "bert": "BERT-base encoder (12 layers, hidden 768), sequence length 32",
    "resnet50": "ResNet-50 (the onnx package's light_resnet50 made batchable)",
    "tiny": "4-layer MLP, width 64 (tests only)",
    "gnmt": "GNMT-like LSTM encoder-decoder (4+4 layers, hidden 1024, vocabulary 32000; encoder and decoder steps "
            "looped per request), source and output lengths drawn from the shipped WMT-like length histogram",
}
NOT_SERVED = {
    "gnmt": "GNMT-like LSTM encoder-decoder: not in this run (`--models mlp,bert,resnet50,gnmt` adds it, about 25 "
            "more minutes; Triton's dynamic batcher cannot loop a decoder, so graph:0/5/20 in the backend stand in "
            "for it).",
}


@dataclass
class Settings:
    models: list[str]
    loads: list[float]
    perf_loads: list[float]
    duration: float
    min_requests: int
    slices: int
    perf_measurement_ms: int
    sla_multiples: list[float]
    sched_sla_multiple: float
    policies: list[str]
    out: Path
    seed: int
    reprofile: bool
    seq2seq_duration: float = 30.0  # seconds per cell for seq2seq models (a request takes about 0.3 s)
    seq2seq_calibration: int = 20  # requests whose mean service time defines a seq2seq model's t1
    # further loads, only for models whose profile shows batching pays: where batching is what keeps a server up,
    # peak throughput needs loads beyond what serial can serve (the paper's loads are several times mu)
    overload_loads: tuple[float, ...] = ()
