"""Every config.pbtxt parameter the backend reads, with the sentence its errors and docs quote, and the constants
their defaults come from. ``settings.py`` parses them; a parameter not in ``PARAMETERS`` fails the load by name.
"""

from __future__ import annotations

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

PARAMETERS = {
    "policy": f"{policy_choices()} (parameters as policy:key=value,..., e.g. lazy:preempt=benefit, "
              "graph:max_queue_delay_microseconds=..,preferred_batch_size=4/8; batcher/policies/registry.py) "
              f"| {WHOLE_GRAPH} (no scheduler: Triton's own dynamic_batching forms the batches); default "
              f"{DEFAULT_POLICY} where the parameter is absent, as `lazybatch repo add` writes it",
    "sla_ms": "default SLA target of a request in ms (a request may override it with its own sla_ms parameter)",
    "stage_dir": "stage directory (manifest.json + stage ONNX files), relative to the version folder",
    "latency_table": "latency table (JSON/CSV), relative to the version folder",
    "whole_graph_model": "the whole-graph ONNX file (used by policy whole_graph), relative to the version folder",
    "profile_on_load": "true: profile the stages at load time when the latency table is missing",
    "example_dims": "per-sample sizes of the dynamic (-1) input dims, perf_analyzer's --shape form, ';' between "
                    "inputs (images:3,320,320): what warm-up feeds and what clients send (`lazybatch repo add` "
                    "writes the stage manifest's example_dims; without it the manifest's are read, else 1)",
    "scheduler_max_batch_size": "largest sub-batch the scheduler forms, in samples (default: max_batch_size)",
    "dec_timesteps": "decoder steps assumed by the slack predictor (seq2seq)",
    "dec_timesteps_coverage": "fraction of the output-length histogram dec_timesteps covers (default 0.9)",
    "allow_nan": "true (default): float inputs may hold NaN/Inf, as in Triton's own backends (perf_analyzer's "
                 "default random data has them) | false: such requests are refused with INVALID_ARG",
    "execution_provider": "auto (CUDA when onnxruntime has it, else CPU) | cpu | cuda",
    "intra_op_threads": "onnxruntime intra-op threads (0: onnxruntime's default)",
    "use_per_session_threads": "true: every stage session gets its own intra-op pool, spinning off (onnxruntime's "
                               "name) | false (default): one pool per model instance shared by all its stages, "
                               "spinning between operators (a cpu_share model parks it while idle: "
                               "docs/colocation.md, \"Parked pools\")",
    "use_env_allocators": "true (default): every onnxruntime session of the model instance (each stage and the whole "
                          "graph) allocates from one CPU arena registered in onnxruntime's environment, so that a "
                          "split model holds one working set, not one per stage (onnxruntime's name; "
                          "sessions/arena.py) | false: an arena per session, onnxruntime's default",
    "inplace_residuals": "true (default): residual stages write their output over their shortcut input, as "
                         "onnxruntime does in the whole graph (docs/onnx.md); false: plain session.run",
    "device_tensors": "auto (default): between stages a tensor stays on the execution provider's device (onnxruntime "
                      "IOBinding; sub-batches joined there, consecutive rows bound by pointer) where that provider "
                      "is not the CPU | true: also on the CPU provider | false: host numpy between stages. Checked "
                      "at load: where the device path's answers on a warm-up batch differ from the host path's in "
                      "any bit, the model serves through host numpy and logs why (sessions/device_tensors.py). "
                      "Static stage and seq2seq models under a scheduling policy; the NPU executor keeps host "
                      "numpy",
    "FORCE_CPU_ONLY_INPUT_TENSORS": "Triton's Python backend's own parameter: \"no\" hands the model inputs that "
                                    "arrive on a GPU as GPU tensors; where the stage tensors live on that GPU "
                                    "(device_tensors) they stay there, wrapped through DLPack without a copy, else "
                                    "they are copied to host memory once (backend/input_tensors.py) | yes (Triton's "
                                    "default): every input arrives in host memory",
    "cuda_graphs": "false (default) | true: on the CUDA provider's device path, each stage captures one CUDA graph "
                   "per batch bucket (powers of two up to the scheduler's largest batch) and a sub-batch replays "
                   "its bucket's graph, padded with its last row; the latency table becomes a step function of the "
                   "batch size. Checked at load: a stage onnxruntime will not capture, or whose padded replay "
                   "differs in any bit from its unpadded run, runs without a graph and the log names it "
                   "(sessions/cuda_graphs.py). Off by default until measured to win on a GPU (docs/deploy.md); "
                   "refused with a log line off CUDA or without device_tensors. Static stage models only",
    "shared_cuda_stream": "false (default) | true: on the CUDA provider's device path, every stage session of an "
                          "instance runs on one CUDA stream (onnxruntime's user_compute_stream, made with cupy), each "
                          "run queued without its end-of-run synchronisation and the host waiting only for the run "
                          "before, so a preemption is late by at most one queued stage; the profiler times stages "
                          "with CUDA events (sessions/cuda_stream.py). Off by default until measured on a GPU "
                          "(docs/deploy.md); refused with a log line off CUDA, without cupy or without "
                          "device_tensors",
    "cancel_poll_ms": "auto (default; 0 is the same): the watcher thread asks each running request whether the "
                      "client cancelled it just before its stage ends and queued ones about once a stage time, so "
                      "a cancel is answered and its compute stops within about one stage time (sweeps >= 2 ms apart, "
                      "<= 16 round trips each, <= 1000 a second); on a decoupled model 100 ms (the asks share the "
                      "path of the streamed parts) | <ms>: each held request at most once per "
                      "<ms>, the rule before (50 was the default; backend/cancel_watch.py)",
    "fuse_stages": "auto (default): eager runs a job that spans every stage as the whole graph in one onnxruntime "
                   "call; lazy and oracle run each request through the whole graph "
                   "where their batch cap is 1 (batching buys nothing, so no boundary is ever used) | true: "
                   "every scheduler policy runs whole passes | false: always stage by stage (backend/fusion.py)",
    "fuse_segments": "0 (default): the scheduler sees every stage of the split | <N>: the stages are merged at load "
                     "into N segments of about equal batch-1 time, each one onnxruntime session, and the scheduler "
                     "preempts and merges only at their N-1 boundaries (fewer session calls; cross-layer fusions "
                     "kept); static graphs (backend/fusion.py segment)",
    "response_thread": "true (default): responses are built and sent on a thread of their own, so the scheduler "
                       "runs the next stage while pb_utils' send waits for the Triton process | false: sent inline "
                       "by the scheduler thread (backend/responder.py)",
    "batch_per_execute": "false (default) | true: each group Triton's dynamic batcher hands to execute is served "
                         "as one batch to its end (graph:0 in the scheduler), and execute returns only once every "
                         "request of it is answered: Triton's batcher as the only batcher, for models with a loop "
                         "inside (seq2seq under `repo add --policy triton:<us>`)",
    "stream_interval_tokens": "decoupled seq2seq models (model_transaction_policy { decoupled: true }): a response "
                              "goes out once a row holds this many new tokens (default 1: every token); the last "
                              "one carries the final flag (backend/seq2seq.py)",
    # seq2seq models: written by `lazybatch repo add` for clients, checked against the stage manifest at load
    "max_source_length": "seq2seq: most source tokens a request may send",
    "max_output_length": "seq2seq: most tokens the decoder generates per sequence",
    "vocab_size": "seq2seq: token ids are 0..vocab_size-1",
    "length_histogram": "seq2seq: the shipped length histogram clients draw request lengths from (chat, wmt)",
}
# production knobs (docs/operations.md); queue names follow Triton's ModelQueuePolicy
PARAMETERS.update({
    "device_group": "absent, empty or none (default): the model has the device to itself, as Triton's per-model "
                    "batchers (served figures: docs/results/colocation.md) | <name>: lazybatch models of one server in "
                    "one group share the device through an arbiter process that picks the next stage job across "
                    "them, started only once a second member loads (docs/colocation.md, \"Served: the arbiter\"); a "
                    "model alone in time holds a lease and runs as an ungrouped one, inline route included | auto: "
                    "the group of the model instance's device (cpu for KIND_CPU, gpu<N> for KIND_GPU device N, npu "
                    "for executor npu; none for a model with more than one instance on its device). Refused for "
                    "policy whole_graph or batch_per_execute (triton:<us>: Triton's batcher runs whole executions)",
    "device_weight": "device_group models: the model's weight in the device's fair share (a number > 0, default 1): "
                     "while models wait for the device, their device time is shared in proportion to their weights",
    "device_priority_level": "device_group models: the model's priority level at the device (an integer >= 0, "
                             "default 0; smaller is more urgent, as Triton's priority levels): a waiting model of a "
                             "more urgent level gets the device first, within the fair share's bound",
    "device_max_queue_size": "device_group models: most samples held across every model of the group (queued or in "
                             "flight; default 0: unbounded); an arrival past it is rejected UNAVAILABLE, saying the "
                             "shared device's queue is full (set it alike on the group's models: each checks its own)",
    "device_lanes": "device_group models: how many stage jobs the group's device runs at once (an integer 1..64, "
                    f"default {DEFAULT_DEVICE_LANES}, from the served figures); one value per group: the arbiter is "
                    "started with the first member's, and a model whose value differs fails its load saying both. "
                    "With more than one lane and intra_op_threads unset, each member's onnxruntime pool gets the "
                    "instance's cores divided among the lanes (at least one thread; docs/colocation.md, \"Lanes\")",
    "device_solo_intra_op_threads": "device_group models: onnxruntime intra-op threads of a whole-graph pass run "
                                    "while the model is alone on the device (no other member active: the solo "
                                    "lease, or no second member yet); default: the instance's cores, where its "
                                    "lanes leave its stages one thread each; 0: such passes keep the lane's "
                                    "threads. Shared, the model runs its stages at the lane's threads "
                                    "(docs/colocation.md, \"Width alone\")",
    "cpu_share": "auto (default) | latency_critical | best_effort | none: on a CPU, the lazybatch models of one "
                 "server share the cores through the kernel's scheduler: while a more urgent one is active (a "
                 "request within the last second), a model's threads are lowered (nice 10, 19 under two) and put "
                 "back after, and a model that holds no request parks its onnxruntime workers (cpu_share_park). "
                 "More urgent: the declared role first (latency_critical, then auto, then best_effort), then the "
                 "shorter sla_ms (deadline-monotonic). A model alone is never lowered. none: opted out, its threads "
                 "are never touched (docs/colocation.md, \"The CPU through the operating system\"). Not for models "
                 "in a device_group (their arbiter takes turns) nor under whole_graph (triton:<us>), which are left "
                 "alone. Putting a thread back needs CAP_SYS_NICE or RLIMIT_NICE >= 20; without either nothing is "
                 "lowered or parked and the log says so once",
    "cpu_share_park": "cpu_share models: true (default): while the model holds no request, its onnxruntime pool's "
                      "workers wait in SCHED_IDLE, so that their spinning after its last operator runs only on a "
                      "core nobody else wants; put back before its next run (docs/colocation.md, \"Parked "
                      "pools\") | false: they spin at the model's weight",
    "cpu_share_nice": "cpu_share models: the nice value the model's threads take while one more urgent model is "
                      "active (an integer 1..19, default 10; under two or more, the larger of it and 19). The "
                      "kernel's fair scheduler weighs nice 0 / 5 / 10 / 19 as 1024 / 335 / 110 / 15",
    "max_queue_size": "most samples the scheduler holds (queued or in flight); more are rejected UNAVAILABLE "
                      "(default 0: unbounded)",
    "timeout_action": "REJECT: refuse a request whose deadline the predictor says cannot be met | DELAY: serve it "
                      "late (default)",
    "metrics": "true (default): export Triton custom metrics (lazybatch_*) on the metrics port",
    "metrics_interval_ms": "how often the metrics are pushed to Triton (default 1000)",
    "memory_release_ms": "at an idle moment at most this often, onnxruntime's arenas are shrunk (at each session's "
                         "next run) and glibc's free heap is returned, so that a burst's memory comes back "
                         "(default 5000; 0: never; backend/memory.py)",
    "fault_injection": "tests only: stage=<index|name>,every=<N>[,mode=sample|run] makes that stage raise "
                       "(default off)",
    # request priorities, named and read like Triton's dynamic_batching priority_levels/default_priority_level
    "priority_levels": "number of request priority levels, 1 the most urgent (default 0: request priorities are "
                       "ignored)",
    "default_priority_level": "the level of a request that sends no request_priority (or 0); required with "
                              "priority_levels",
})

from .npu_executor import PARAMETERS as _NPU_EXECUTOR_PARAMETERS  # noqa: E402 (read by npu_executor.py)

PARAMETERS.update(_NPU_EXECUTOR_PARAMETERS)
