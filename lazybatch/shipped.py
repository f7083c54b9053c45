"""The models lazybatch ships and the repositories it builds from them: each model's ONNX file (weights generated
here, seeded), its batch cap and SLA, and the default comparison (one model under the default policy beside
Triton's own dynamic batcher and serial), plus the quickstart's co-located pair. What `lazybatch repo default`, the
quickstart and the benchmarks serve; the repository writer itself is ``lazybatch/repo.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from lazybatch.backend.stages import StageRunner
from lazybatch.backend.stage_profile import profile_batch_sizes
from lazybatch.formats.stage_manifest import load_manifest
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.policies.registry import TritonPolicy
from lazybatch.repo import add_model, parse_repo_policy, profile_seq2seq, split_into


# The shipped comparison: one model under lazybatch's default policy (eager), under Triton's own dynamic batcher
# (three queue delays) and serial. suffix -> policy. The paper's LazyBatching (lazy) is among ALL_POLICIES.
COMPARISON = {
    "eager": "eager",
    "triton_0us": "triton:0",
    "triton_5000us": "triton:5000",
    "triton_20000us": "triton:20000",
    "serial": "serial",
}


# Seq2seq models cannot run under Triton's dynamic batcher (no decoder loop): graph batching inside the backend
# stands in for it, at the same queue delays.
SEQ2SEQ_BASELINES = {"triton_0us": ("graph_0ms", "graph:0"), "triton_5000us": ("graph_5ms", "graph:5"),
                     "triton_20000us": ("graph_20ms", "graph:20")}


# What each shipped model is: ResNet-50 (compute-bound on a CPU: batching barely pays), an 8-layer MLP of width
# 2048 (matrix-vector bound at batch 1: batching pays several times over), the two regimes docs/triton.md describes;
# BERT-base at sequence length 32 (the zoo's encoder, 12 layers, hidden 768); and a tiny 4-layer MLP of width 64
# (tests: builds and serves in seconds); MobileNet-v1 (the zoo's, depthwise convolutions: a model the default policy
# was not tuned on); a GPT-2-like decoder-only LM at the served size (lazybatch/onnx_tools/zoo/decoder_lm.py SERVED:
# 4 layers, d 256, 64 prompt + 512 output tokens), whose requests' lengths follow the shipped chat-like histogram;
# and the paper's two seq2seq models, GNMT and the Transformer (base: 6+6 layers, d 512, as the zoo exports them),
# whose lengths follow the shipped WMT-like histogram.
SHIPPED_MODELS = ("resnet50", "mlp", "bert", "tiny", "gnmt", "transformer", "mobilenet", "lm")


SEQ2SEQ_KINDS = ("gnmt", "transformer", "lm")


KIND_MAX_BATCH = {"resnet50": 8, "mlp": 16, "bert": 8, "tiny": 8, "gnmt": 8, "transformer": 8, "mobilenet": 8,
                  "lm": 16}


KIND_SLA_MS = {"resnet50": 100.0, "mlp": 10.0, "bert": 300.0, "tiny": 50.0, "gnmt": 5000.0, "transformer": 5000.0,
               "mobilenet": 100.0, "lm": 5000.0}


BERT_SEQ_LEN = 32


def build_onnx(kind: str, path: Path) -> None:
    """Write the ONNX file of one of the models lazybatch ships (KIND_SLA_MS: weights generated here, seeded), as
    the default repository and the benchmarks build it."""
    from lazybatch.staging import batchable_light_model, make_mlp

    if kind == "resnet50":
        batchable_light_model("resnet50", path)
    elif kind == "mlp":
        make_mlp(path, in_dim=2048, width=2048, depth=8, out_dim=1000, seed=0)
    elif kind == "tiny":
        make_mlp(path, in_dim=64, width=64, depth=4, out_dim=8, seed=0)
    elif kind in ("gnmt", "transformer", "mobilenet"):
        import onnx

        from lazybatch.onnx_tools.zoo import build_model

        onnx.save(build_model("mobilenet_v1" if kind == "mobilenet" else kind, seed=0), str(path))
    elif kind == "lm":
        import onnx

        from lazybatch.onnx_tools.zoo.decoder_lm import SERVED, gpt2

        g, sec = gpt2(seed=0, config=SERVED)
        onnx.save(g.model({"lazybatch.seed": "0", "lazybatch.seq2seq": sec},
                          doc=f"GPT-2-like decoder-only LM, {SERVED}; random weights"), str(path))
    elif kind == "bert":
        import onnx

        from lazybatch.onnx_tools.zoo.nlp import bert

        model = bert(seed=0, seq_len=BERT_SEQ_LEN).model(
            {"lazybatch.seed": "0"}, doc=f"BERT-base encoder, sequence length {BERT_SEQ_LEN}; random weights")
        onnx.save(model, str(path))
    else:
        raise ConfigError(f"unknown model kind {kind!r}; choose one of {', '.join(SHIPPED_MODELS)}", field="--model")


def default_build_dir(repository: str | Path) -> Path:
    """Where build_default_repository keeps a repository's ONNX file, stages and latency table: beside it, not
    inside it (tritonserver would try to load any folder there as a model). A second repository built with this
    ``work`` reuses them (no new split or profile)."""
    repo = Path(repository)
    return repo.resolve().parent / ".lazybatch-build" / repo.name


def build_default_repository(repository: str | Path = "model_repository", *, kind: str = "resnet50",
                             work: str | Path | None = None, max_batch_size: int | None = None,
                             sla_ms: float | None = None, max_stages: int | None = 20, profile_reps: int = 5,
                             force: bool = False, policies: dict[str, str] | None = None,
                             reprofile: bool = False, seq2seq_baselines: bool = True, decoupled: bool = False,
                             stream_interval_tokens: int | None = None, priority_levels: int = 0,
                             default_priority_level: int = 0,
                             priority_timeouts_us: Mapping[int, int] | None = None,
                             parameters: Mapping[str, Mapping[str, str]] | None = None, replace: bool = False,
                             log: Any = print) -> Path:
    """``kind`` split once, profiled once, and served under every policy of COMPARISON (names ``<kind>_<suffix>``);
    the weights are hard-linked between model directories. ResNet-50 is the onnx package's light model made
    batchable (random weights); the MLPs are cut after every Relu. ``policies`` (suffix -> policy) replaces
    COMPARISON; ``reprofile`` measures the latency table
    again and rewrites the model directories. ``seq2seq_baselines``: a seq2seq model's triton_<us> suffixes become
    the backend's graph batching (graph_<ms>), as the regimes page measures them; False keeps Triton's own batcher
    (each group decoded to its end in one execute, batch_per_execute). ``decoupled``: every model streams its tokens
    (seq2seq and decoder models only, ``add_model(decoupled=True)``), a response every ``stream_interval_tokens``
    tokens (default 1). ``priority_levels``, ``default_priority_level``:
    every model gets them; ``priority_timeouts_us`` the models under Triton's own batcher (``add_model``).
    ``parameters`` (suffix -> config.pbtxt parameters): further parameters of a suffix's model, e.g. a device_group
    or a benchmark's variant;
    ``replace`` rewrites existing model directories from the build as it is (no new split or profile)."""
    from lazybatch.staging import split_model

    if kind not in SHIPPED_MODELS:
        raise ConfigError(f"unknown model kind {kind!r}; choose one of {', '.join(SHIPPED_MODELS)}", field="--model")
    mbs = max_batch_size or KIND_MAX_BATCH[kind]
    sla = sla_ms if sla_ms is not None else KIND_SLA_MS[kind]
    repo = Path(repository)
    work_dir = Path(work) if work else default_build_dir(repo)
    work_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = work_dir / f"{kind}.onnx"
    if not onnx_path.exists() or force:
        log(f"building {onnx_path}")
        build_onnx(kind, onnx_path)
    stages = work_dir / f"{kind}_stages"
    if not (stages / "manifest.json").exists() or force:
        if kind in ("mlp", "tiny"):
            import onnx

            relus = [i for i, n in enumerate(onnx.load(str(onnx_path)).graph.node) if n.op_type == "Relu"]
            split_model(onnx_path, stages, cut_after=relus, name=kind)
        else:
            # seq2seq: the splitter's own encoder-step/decoder-step cuts (merging them further broke the step's
            # outputs the decoder loop reads)
            n = None if kind in SEQ2SEQ_KINDS else max_stages
            log(f"splitting into {'the default' if n is None else f'at most {n}'} stages -> {stages}")
            split_into(onnx_path, stages, max_stages=n, name=kind)
    table = work_dir / f"{kind}_latency_b{mbs}.json"
    if not table.exists() or force or reprofile:
        log(f"profiling the stages at batch sizes up to {mbs} -> {table}")
        if "seq2seq" in load_manifest(stages).raw:  # encoder/decoder steps, length histogram in the meta
            profile_seq2seq(stages, mbs, reps=profile_reps, execution_provider="auto", intra_op_threads=0).save(table)
        else:
            runner = StageRunner(stages)
            runner.run_all(runner.sample_inputs(1))
            runner.profile(profile_batch_sizes(mbs), reps=profile_reps).save(table)
    seq2seq = "seq2seq" in load_manifest(stages).raw
    for suffix, policy in (policies or COMPARISON).items():
        if seq2seq and seq2seq_baselines and suffix in SEQ2SEQ_BASELINES:
            suffix, policy = SEQ2SEQ_BASELINES[suffix]
        name = f"{kind}_{suffix}"
        if (repo / name / "config.pbtxt").exists() and not (force or reprofile or replace):
            log(f"{name}: exists")
            continue
        timeouts = priority_timeouts_us if isinstance(parse_repo_policy(policy), TritonPolicy) else None
        add_model(onnx_path, repo, name=name, policy=policy, sla_ms=sla, max_batch_size=mbs,
                  stages=stages, latency_table=table, force=True,
                  parameters=(parameters or {}).get(suffix) or None,
                  decoupled=decoupled, stream_interval_tokens=stream_interval_tokens,
                  priority_levels=priority_levels, default_priority_level=default_priority_level,
                  priority_timeouts_us=timeouts)
        log(f"{name}: {policy}")
    return repo


# The quickstart's co-located pair (docs/colocation.md): a small model beside a large one on one tritonserver, the small one
# the 8 x 2048 MLP (t1 a few ms, SLA 10 ms), the large one ResNet-50 (t1 ten times that, SLA 100 ms). Under lazybatch
# both run under lazybatch's defaults: the default policy with the CPU share on (``cpu_share: auto``, the default,
# backend/cpu_share.py): the large model's threads yield the cores while the small one, whose SLA is shorter, has
# requests. Under Triton's batcher each runs in its
# own backend process and they share the cores as the kernel shares them by default. Names are <kind>_<suffix>.
PAIR_KINDS = {"small": "mlp", "large": "resnet50"}


PAIR_OURS = "eager_shared"
PAIR_POLICIES = {PAIR_OURS: "eager", "triton_0us": "triton:0", "triton_5000us": "triton:5000"}


def build_pair_repository(repository: str | Path = "model_repository", *, force: bool = False,
                          built: Sequence[str] = (), kinds: Mapping[str, str] = PAIR_KINDS,
                          sla_ms: Mapping[str, float] | None = None, log: Any = print) -> Path:
    """Add the co-located pair's models to ``repository`` (``kinds``, role -> kind, default PAIR_KINDS, under
    PAIR_POLICIES), beside the default comparison: a model already there is kept, and each kind is split
    and profiled once for both (build_default_repository's build folder). ``force`` rebuilds everything but the
    kinds in ``built`` (just rebuilt by the caller): their pair models are only rewritten from that build.
    ``sla_ms`` (kind -> ms, default KIND_SLA_MS): the configs' SLAs, which rank the models in the CPU share (the
    shorter one is the latency-critical one)."""
    for kind in kinds.values():
        again = force and kind in built
        build_default_repository(repository, kind=kind, policies=PAIR_POLICIES, force=force and not again,
                                 replace=again, sla_ms=(sla_ms or {}).get(kind), log=log)
    return Path(repository)
