"""Every config.pbtxt parameter the backend reads, defined once: its name, group, default, what it does (the cell
docs/triton.md shows), and whether it is an experiment lever (a knob kept for measurements, which a user need
not set). ``settings.py`` parses them, reading each default here; a parameter not
in the schema fails the load by name; docs/triton.md's tables and ``repo add --help`` are generated from it
(``parameters_docs.py``: ``python -m lazybatch.backend.parameters_docs --write``) and a test compares them.
"""

from __future__ import annotations

from dataclasses import dataclass

from lazybatch.batcher.policies.registry import DEFAULT_POLICY, policy_choices

# Each poll is a round trip to the server process per held request: at a fixed 2 ms it was most of the backend's own
# cost in the NPU-served benchmark (docs/npu.md), and a fixed 50 ms left a cancelled request running ~25 ms (median)
# after its cancel. The default (0, written "auto") paces the asks by the model's stage times instead, within a
# bounded IPC load (backend/cancel_watch.py).
DEFAULT_CANCEL_POLL_MS = 0.0
# ... except on decoupled models. Their streamed parts reach Triton through the same stub-to-server message path as
# the asks, and asks paced by stage times (the LM's are under 1 ms: about 1000 asks a second) held the parts back:
# served at 90% load the LM's mean time to first token at the client was 48-250 ms (p99 0.3-1.6 s) while its parts
# left the backend 24.5 ms after arrival on average; at a fixed 100 ms the client saw 19-21 ms (p99 39-45 ms), at
# 1000 ms 22-23 ms (a probe of git commit 0cd9c15, benchmarks/probes/probe_first_part.py; its output is in git there,
# docs/data/first_part_probe.txt). A cancel on a stream is then answered within about 100 ms; an explicit
# cancel_poll_ms wins.
DECOUPLED_CANCEL_POLL_MS = 100.0
WHOLE_GRAPH = "whole_graph"  # the model runs the whole ONNX graph on what Triton batched (dynamic_batching)

DEFAULT_DEVICE_LANES = 2  # served, on 2 cores: two one-thread lanes beat one lane of two threads (docs/colocation.md)
MAX_DEVICE_PRIORITY_LEVEL = 32767  # the arbiter's protocol carries it as a signed 16-bit integer
MAX_DEVICE_LANES = 64  # far past any measured use (docs/colocation.md, "Lanes": 2 already contend on 2 cores)
NO_DEVICE_GROUP = "none"  # device_group: "none" (as absent) keeps a model off every shared device
AUTO_DEVICE_GROUP = "auto"  # device_group: "auto" joins the group of the model instance's device

# the groups, in the docs' order
GROUPS = ("model", "device", "serving", "admission", "co-location", "seq2seq", "NPU")


@dataclass(frozen=True)
class Parameter:
    """One config.pbtxt parameter (all are strings: ``parameters { key: .. value { string_value: .. } }``)."""

    name: str
    group: str  # one of GROUPS
    value: str | None  # the default as config.pbtxt would write it, read where the parameter is absent (None: none)
    default: str  # the default as the docs show it (markdown)
    doc: str  # what it does: the docs' cell (markdown)
    lever: bool = False  # an experiment lever: measured with, never needed to serve

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"parameter {self.name}: group {self.group!r} is not one of {GROUPS}")


POLICY_DOC = (f"any policy spec of `batcher/` ({policy_choices()}; parameters as `policy:key=value,...`, e.g. "
              "`lazy:preempt=benefit`, `graph:max_queue_delay_microseconds=5000,preferred_batch_size=4/8`; above), "
              f"or `{WHOLE_GRAPH}` (no scheduler: Triton's dynamic_batching does the batching)")

P = Parameter
SCHEMA: tuple[Parameter, ...] = (
    P('policy', 'model',
      value=DEFAULT_POLICY,
      default=f"`{DEFAULT_POLICY}` (the registry's default; `repo add` writes it too)",
      doc=POLICY_DOC),
    P('sla_ms', 'model',
      value=None,
      default='none',
      doc='default SLA target of a request (a request may carry its own)'),
    P('stage_dir', 'model',
      value='stages',
      default='`stages`',
      doc='stage directory, relative to the version folder'),
    P('latency_table', 'model',
      value='latency.json',
      default='`latency.json`',
      doc='latency table (JSON or CSV), relative to the version folder'),
    P('whole_graph_model', 'model',
      value='model.onnx',
      default='`model.onnx`',
      doc='the whole graph, for `policy: whole_graph`'),
    P('profile_on_load', 'model',
      value='false',
      default='`false`',
      doc='`true`: profile the stages at load time when the latency table is missing (and save it)'),
    P('example_dims', 'model',
      value=None,
      default="the stage manifest's",
      doc="per-sample sizes of dynamic (-1) input dims, perf_analyzer's `--shape` form with `;` between inputs "
          '(`images:3,320,320`): what the whole-graph warm-up feeds, what `lazybatch load` sends and what `lazybatch '
          "perf` passes as `--shape`; `repo add` writes the split's `--input-shape`"),
    P('scheduler_max_batch_size', 'model',
      value=None,
      default='`max_batch_size`',
      doc='largest sub-batch the scheduler forms, in samples'),
    P('dec_timesteps', 'seq2seq',
      value=None,
      default='-',
      doc="decoder steps the slack predictor assumes (seq2seq; `repo add` writes the length histogram's 90% length)"),
    P('dec_timesteps_coverage', 'seq2seq',
      value='0.9', lever=True,
      default='0.9',
      doc='seq2seq: the fraction of the output-length histogram that `dec_timesteps` covers'),
    P('allow_nan', 'model',
      value='true',
      default='`true`',
      doc="`true`: float inputs may hold NaN/Inf, as with Triton's own backends (perf_analyzer's default random data "
          'holds them); `false` (`repo add --reject-nan`): such a request is refused with INVALID_ARG'),
    P('execution_provider', 'device',
      value='auto',
      default='`auto`',
      doc='`auto` (CUDA when onnxruntime offers it, else CPU), `cpu`, `cuda`'),
    P('intra_op_threads', 'device',
      value='0',
      default='0',
      doc='onnxruntime intra-op threads (0: its default; a `device_group` model with more than one lane: the cores '
          'divided among the lanes)'),
    P('use_per_session_threads', 'device',
      value=None, lever=True,
      default='`false`',
      doc="onnxruntime's name: `true` gives every stage session its own intra-op pool (spinning off); by default all "
          'the stages of a model instance share one pool, as the whole graph has one '
          '([onnx.md](onnx.md#splitting-overhead-and-split-time-benchmark) has the measurements)'),
    P('use_env_allocators', 'device',
      value='true', lever=True,
      default='`true`',
      doc="onnxruntime's name: every session of a model instance (each stage and the whole graph) allocates from one "
          "CPU arena registered in onnxruntime's environment, so a split model holds one working set instead of one "
          "per stage; `false`: an arena per session, onnxruntime's default ([onnx.md](onnx.md#one-arena-per-process) "
          'has the measurements)'),
    P('inplace_residuals', 'device',
      value='true', lever=True,
      default='`true`',
      doc='a residual stage (onnxruntime NCHWc `Conv` with a `Sum` input, or an `Add`, whose shortcut input nothing '
          'reads afterwards) writes its output over that input through IOBinding, as onnxruntime does inside the '
          'whole graph; checked bit for bit against a plain run when the model loads '
          '([onnx.md](onnx.md#in-place-residual-stages)); `false`: every stage runs with a plain `session.run` (it '
          'leans on onnxruntime internals)'),
    P('device_tensors', 'device',
      value='auto',
      default='`auto`',
      doc="`auto`: between stages a tensor stays an onnxruntime `OrtValue` on the execution provider's device (IO "
          'binding) where the provider is not the CPU; `true`: on the CPU provider too; `false`: host numpy. Checked '
          'bit for bit against the host path at load, falling back with a log line '
          '([deploy.md](deploy.md#stage-tensors-on-the-device))'),
    P('FORCE_CPU_ONLY_INPUT_TENSORS', 'device',
      value=None,
      default='`yes` (Triton\'s)',
      doc='Triton\'s Python backend\'s own parameter: "no" hands the model inputs that arrive on a GPU as GPU '
          'tensors; where the stage tensors live on that GPU (device_tensors) they stay there, wrapped through '
          'DLPack without a copy, else they are copied to host memory once (backend/input_tensors.py) | yes '
          "(Triton's default): every input arrives in host memory"),
    P('cuda_graphs', 'device',
      value='false', lever=True,
      default='`false`',
      doc='`true`: on the CUDA device path each stage replays a CUDA graph per batch bucket, a sub-batch padded to '
          'its bucket; stages that cannot be captured, or whose padded replay differs from the unpadded run, run '
          'without; refused off CUDA with a log line ([deploy.md](deploy.md#cuda-graphs)). Unmeasured on a GPU, so '
          'off'),
    P('shared_cuda_stream', 'device',
      value='false', lever=True,
      default='`false`',
      doc='`true`: on the CUDA device path every stage session of an instance runs on one CUDA stream (cupy), each '
          'run queued without its synchronisation and at most one in flight; the profiler times with CUDA events; '
          'refused off CUDA or without cupy with a log line ([deploy.md](deploy.md#one-cuda-stream)). Unmeasured on a'
          ' GPU, so off'),
    P('cancel_poll_ms', 'serving',
      value='auto',
      default='`auto`',
      doc='`auto` (or 0): the watcher thread asks each running request `is_cancelled()` (a round trip to the server; '
          "off the scheduler thread) just before its stage's predicted end and queued ones about once a stage time, "
          'so a cancel is answered and its compute stops within about one stage '
          '([operations.md](operations.md#cancellation)); on a decoupled model every 100 ms (the asks share '
          "python_backend's message path with the streamed parts and held them back: "
          '[results/streaming.md](results/streaming.md)); `<ms>`: each held request at most once per `<ms>` (50 was '
          'the default before)'),
    P('fuse_stages', 'device',
      value='auto', lever=True,
      default='`auto`',
      doc='`auto`: eager keeps the whole graph (`whole_graph_model`) beside the stages and runs a job that spans '
          'every stage as one onnxruntime call; lazy and oracle run each request through the whole graph where their '
          'batch cap is 1 (batching buys nothing, so no stage boundary would ever be used; below); `true`: every '
          "scheduler policy runs whole passes; `false`: always stage by stage. The whole graph must give the stages' "
          'result on a sample batch at load, or the model is served stage by stage and the log says why'),
    P('fuse_segments', 'device',
      value='0', lever=True,
      default='`0`',
      doc='`0`: the scheduler sees every stage of the split; `<N>`: at load the stages are merged into N segments of '
          'about equal batch-1 time (sessions/segments.py: their nodes and weights in one graph, a weight two stages '
          'share kept once), each one onnxruntime session, and the scheduler preempts and merges only at their N-1 '
          "boundaries: fewer session calls and onnxruntime's cross-layer fusions kept, at the price of coarser "
          'decision points (for `eager:urgency=true`, whose boundaries otherwise cost the stage-by-stage pass). The '
          "segments must give the stages' result on sample batches at load, or the model is served stage by stage and"
          ' the log says why; the merged files live in a temporary folder of the model instance. ResNet-50 (20 '
          'stages), a pass relative to stage by stage, mean [min-max] over rounds at commit 8590699: 2 segments 0.76x'
          ' [0.74-0.77] at batch 1 and 0.74x [0.73-0.76] at batch 8, 4 segments 0.79x [0.78-0.81] and 0.81x '
          '[0.78-0.87], 8 segments 0.89x and 0.90x, the whole graph 0.75x and 0.74x (`python -m '
          'benchmarks.bench_segments` at e15d6b6, in-process, an Intel Xeon with 2 cores; raw data '
          '[data/segments_resnet50_b1.json](data/segments_resnet50_b1.json), '
          '[data/segments_resnet50_b8.json](data/segments_resnet50_b8.json)). Static graphs only'),
    P('response_thread', 'serving',
      value='true', lever=True,
      default='`true`',
      doc='`true`: answers are built and sent by a thread of their own, so the scheduler thread runs the next stage '
          "while pb_utils' `send` waits for the Triton process (below); `false`: the scheduler thread sends each "
          'response itself'),
    P('batch_per_execute', 'serving',
      value='false',
      default='`false`',
      doc="`true` (written by `repo add --policy triton:<us>` for seq2seq models): each group Triton's dynamic "
          'batcher hands to `execute` is one batch served to its end under `policy: graph:0`, and `execute` returns '
          'once all of it is answered; any other policy is refused at load'),
    P('stream_interval_tokens', 'seq2seq',
      value='1',
      default='1',
      doc='a decoupled seq2seq model (`model_transaction_policy { decoupled: true }`, `repo add --decoupled`): a '
          'response goes out once a row holds this many new tokens; the last part carries the final flag '
          '([below](#streaming-decoupled-models))'),
    P('max_source_length', 'seq2seq',
      value=None,
      default='from the manifest',
      doc='seq2seq only: most source tokens a request may send; written by `repo add` for clients, checked against '
          'the stage manifest at load'),
    P('max_output_length', 'seq2seq',
      value=None,
      default='from the manifest',
      doc='seq2seq only: most tokens the decoder generates per sequence; written by `repo add` for clients, checked '
          'against the stage manifest at load'),
    P('vocab_size', 'seq2seq',
      value=None,
      default='from the manifest',
      doc='seq2seq only: token ids are 0..`vocab_size`-1; written by `repo add` for clients, checked against the '
          'stage manifest at load'),
    P('length_histogram', 'seq2seq',
      value=None,
      default='none',
      doc='seq2seq only: the shipped length histogram clients draw request lengths from (`chat`, `wmt`)'),
    P('device_group', 'co-location',
      value='',
      default='empty: none',
      doc="opt-in (off by default: served on this 2-core CPU, the pair's small model averaged 0.86x of Triton 0 ms's "
          "figure (missed), a member alone and light load behind Triton's per-model batchers: "
          '[colocation.md](colocation.md), "Opt-in; off by default"). `<name>`: the lazybatch models of one server in'
          " one group share the device through the group's arbiter process, which picks the next stage job across "
          'them ([colocation.md](colocation.md), "Served: the arbiter"); the arbiter starts only once a second member'
          ' loads, and a model alone in time holds a lease under which it runs as an ungrouped model (no message per '
          "job, inline route on). `auto`: the group of the instance's device (`cpu` for KIND_CPU, `gpu<N>` for "
          'KIND_GPU device N, `npu` for `executor: npu`; none for a model with more than one instance on its device).'
          ' Absent, empty or `none`: the model has the device to itself. Refused for `whole_graph` (`triton:<us>`) '
          "and `batch_per_execute` models (Triton's batcher runs their executions whole). Other backends in the "
          'server (onnxruntime, ...) are outside the arbiter'),
    P('device_weight', 'co-location',
      value='1',
      default='1',
      doc="a `device_group` model's weight in the device's fair share (a number > 0): while models wait for the "
          'device their device time is shared in proportion to their weights (a weight-3 model gets about 3x the '
          'device time of a weight-1 one under saturation); refused with `device_group: none`'),
    P('device_priority_level', 'co-location',
      value='0',
      default='0',
      doc="a `device_group` model's priority level at the device (an integer 0..32767; smaller is more urgent, as "
          "Triton's priority levels): of the models waiting, one of a more urgent level gets the device first, within"
          " the fair share's bound (a weight, not a level, gives a model more of the device); refused with "
          '`device_group: none`'),
    P('device_max_queue_size', 'co-location',
      value='0',
      default='0 (unbounded)',
      doc='a `device_group` model: most samples held (queued or in flight) across every model of the group; an '
          'arrival past it is refused UNAVAILABLE with "the shared device\'s queue is full (N samples held across M '
          'models, ...)". One round trip to the arbiter per arrival, only where it is set; each model checks the '
          "group's total against its own value, so set it alike on the group's models; refused with `device_group: "
          'none` or below `max_batch_size`'),
    P('device_lanes', 'co-location',
      value=str(DEFAULT_DEVICE_LANES), lever=True,
      default=str(DEFAULT_DEVICE_LANES),
      doc="a model on a shared device: how many stage jobs the group's device runs at once (1..64). One value per "
          "group: the arbiter is started with the first member's value, and a model whose value differs fails its "
          'load naming both values and the members (a warning would leave it READY under a setting its own config '
          "contradicts). With more than one lane and no `intra_op_threads`, each member's onnxruntime pool is the "
          "instance's cores divided among the lanes (at least 1; the stub's log says so). Measured on 2 cores in "
          '[colocation.md](colocation.md#lanes): two lanes pay only with one thread per job, which is why the two go '
          'together; refused without `device_group`'),
    P('device_solo_intra_op_threads', 'co-location',
      value=None, lever=True,
      default='the cores, where the lanes leave each member one thread',
      doc='a model on a shared device: the onnxruntime intra-op threads of its whole-graph passes while it is alone '
          "on the device (no other member active: the arbiter's solo lease, or no second member yet). onnxruntime "
          'cannot resize a pool, so the whole graph gets a session of its own at this width beside the stages at the '
          "lane's; shared, a job that spans every stage runs as the stages, and wide passes do not calibrate the "
          'table (which describes the stages). `0`: off. The default is off where the lanes leave more than one '
          "thread (the stages would then need pools of their own that wake per stage); a value above the lane's turns"
          ' it on anyway ([colocation.md](colocation.md#width-alone)); refused without `device_group`'),
    P('cpu_share', 'co-location',
      value='auto',
      default='`auto`',
      doc='auto (default) | latency_critical | best_effort | none: on a CPU, the lazybatch models of one server '
          "share the cores through the kernel's scheduler: while a more urgent one is active (a request within "
          "the last second), a model's threads are lowered (nice 10, 19 under two) and put back after, and a "
          'model that holds no request parks its onnxruntime workers (cpu_share_park). More urgent: the declared'
          ' role first (latency_critical, then auto, then best_effort), then the shorter sla_ms '
          '(deadline-monotonic). A model alone is never lowered. none: opted out, its threads are never touched '
          '(docs/colocation.md, "The CPU through the operating system"). Not for models in a device_group (their'
          ' arbiter takes turns) nor under whole_graph (triton:<us>), which are left alone. Putting a thread '
          'back needs CAP_SYS_NICE or RLIMIT_NICE >= 20; without either nothing is lowered or parked and the log'
          ' says so once'),
    P('cpu_share_park', 'co-location',
      value='true', lever=True,
      default='`true`',
      doc="cpu_share models: true (default): while the model holds no request, its onnxruntime pool's workers "
          'wait in SCHED_IDLE, so that their spinning after its last operator runs only on a core nobody else '
          'wants; put back before its next run (docs/colocation.md, "Parked pools") | false: they spin at the '
          "model's weight"),
    P('cpu_share_split', 'co-location',
      value='true', lever=True,
      default='`true`',
      doc='cpu_share models: true (default): while a more urgent member and a less urgent one are both active, the '
          "server's cores are split between them (the most urgent takes the first half, at least one core; every "
          "member below it the rest), each moving its own threads (sched_setaffinity, no privilege needed), and "
          'every thread goes back to every core once they are not; a model alone or beside equals keeps every core '
          '(docs/colocation.md, "Split cores") | false: only the nice and the parked pools'),
    P('cpu_share_nice', 'co-location',
      value='10', lever=True,
      default='10',
      doc="cpu_share models: the nice value the model's threads take while one more urgent model is active (an "
          "integer 1..19, default 10; under two or more, the larger of it and 19). The kernel's fair scheduler "
          'weighs nice 0 / 5 / 10 / 19 as 1024 / 335 / 110 / 15'),
    P('max_queue_size', 'admission',
      value='0',
      default='0 (unbounded)',
      doc='most samples the scheduler holds (queued or in flight); more are refused UNAVAILABLE '
          '([operations.md](operations.md))'),
    P('timeout_action', 'admission',
      value='DELAY',
      default='`DELAY`',
      doc='`REJECT`: refuse a request whose deadline the predictor says cannot be met; `DELAY`: serve it late '
          '([operations.md](operations.md))'),
    P('metrics', 'serving',
      value='true',
      default='`true`',
      doc='`true`: export Triton custom metrics (`lazybatch_*`) on the metrics port ([operations.md](operations.md))'),
    P('metrics_interval_ms', 'serving',
      value='1000',
      default='1000',
      doc='how often the metrics are pushed to Triton, in ms (at least 10)'),
    P('memory_release_ms', 'serving',
      value='5000',
      default='5000',
      doc='at a quiet moment (nothing run for 0.1 s; under endless load every 4 x this at the latest) at most this '
          "often, onnxruntime's arenas shrink at each session's next run and glibc returns its free heap, so that a "
          "burst's memory comes back (0: never; [operations.md](operations.md#memory-after-a-burst))"),
    P('fault_injection', 'serving',
      value='', lever=True,
      default='off',
      doc='tests only: `stage=<index|name>,every=<N>[,mode=sample|run]` makes that stage raise '
          '([operations.md](operations.md))'),
    P('priority_levels', 'admission',
      value='0',
      default='0 (priorities ignored)',
      doc="number of request priority levels, 1 the most urgent, as in Triton's dynamic batcher (below)"),
    P('default_priority_level', 'admission',
      value='0',
      default='required with levels',
      doc='the level of a request that sends no `request_priority` (or 0); required with `priority_levels`'),
    P('executor', 'NPU',
      value='onnxruntime',
      default='`onnxruntime`',
      doc='`npu`: outputs from onnxruntime, each stage released `npu_time_scale` x its modelled NPU time after it '
          "started; the latency table is the NPU model's (`repo add --executor npu`, "
          '[npu.md](npu.md#a-simulated-deployment-the-npu-time-executor))'),
    P('npu_time_scale', 'NPU',
      value='1',
      default='1',
      doc="`executor: npu`: the wall clock runs k times slower than the NPU; the scheduler's table is the NPU table "
          'times k'),
)
BY_NAME: dict[str, Parameter] = {p.name: p for p in SCHEMA}
PARAMETERS: dict[str, str] = {p.name: p.doc for p in SCHEMA}  # name -> what it does


def default_value(name: str) -> str | None:
    """The text a parameter has where config.pbtxt leaves it out."""
    return BY_NAME[name].value
