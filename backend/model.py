"""The generic Triton Python-backend model of lazybatch.

A model directory's ``1/model.py`` is one line, ``from lazybatch.backend.model import TritonPythonModel``; everything
model-specific comes from that directory's ``config.pbtxt`` parameters (see ``config.PARAMETERS``).

Two modes:

- a scheduler policy (eager, lazy, oracle, graph, serial): ``execute`` validates and
  enqueues each request and returns ``None``; the scheduler thread answers each request later through its response
  sender with TRITONSERVER_RESPONSE_COMPLETE_FINAL. Triton keeps handing the instance new requests meanwhile, which
  is what lets LazyBatching regroup them at stage boundaries. A seq2seq model may be decoupled
  (``model_transaction_policy { decoupled: true }``): it then streams its tokens as they are made, each part a
  response without the final flag, the last one with it (backend/seq2seq.py).
- ``whole_graph``: no scheduler; the whole ONNX graph runs on whatever Triton's own ``dynamic_batching`` grouped
  into one ``execute`` call (the real-world graph-batching baseline).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.request import Status
from lazybatch.batcher.admission import QueuePolicy
from lazybatch.sessions.install import require_onnxruntime
from lazybatch.formats.stage_manifest import load_manifest

from .settings import BackendSettings
from .config_pbtxt import parse_config_json
from .arbiter.sizing import plan_device
from .request_parsing import RequestOptions, check_deadline, parse_request_parameters, validate_request
from .execute_latch import Latch
from .faults import FaultInjector
from .metrics import INVALID, ModelMetrics, TritonMetricsExporter
from .os_weights import threads
from .model_kinds import MODEL_KINDS, BuildInputs, ModelParts, executor_of, model_kind
from .responder import ResponseThread
from .input_tensors import described, keeps_gpu_inputs, read_inputs
from .stages import StageRunner, cuda_graph_buckets, shared_stream, wants_device_tensors
from .stats_logs import StatsLogs
from .stub_process import freeze_loaded_heap, process_wide_onnxruntime

try:  # only importable inside the Triton Python backend stub
    import triton_python_backend_utils as pb_utils  # type: ignore
except ImportError:  # pragma: no cover - unit tests import this module without Triton
    pb_utils = None


# distinct request parameter texts whose options are kept (a client sends a few; past this they are parsed anew)
OPTIONS_KEPT = 64


def _error_code(status: Status) -> Any:
    te = pb_utils.TritonError
    name = {Status.CANCELLED: "CANCELLED", Status.UNAVAILABLE: "UNAVAILABLE", Status.ERROR: "INTERNAL"}.get(
        status, "INTERNAL")
    return getattr(te, name, getattr(te, "INTERNAL", None))


def _error_response(message: str, code_name: str = "INVALID_ARG") -> Any:
    te = pb_utils.TritonError
    code = getattr(te, code_name, None)
    err = te(message, code) if code is not None else te(message)
    return pb_utils.InferenceResponse(output_tensors=[], error=err)


class TritonPythonModel:
    """Serves a staged ONNX model under a batching policy (see the module docstring)."""

    def initialize(self, args: dict[str, Any]) -> None:
        require_onnxruntime()  # every model kind runs onnxruntime: say which extra is missing before anything else
        cfg = parse_config_json(args["model_config"])
        version_dir = Path(args["model_repository"]) / str(args["model_version"])
        s = BackendSettings.from_config(cfg, version_dir)
        # the group first: its lanes size the onnxruntime pool (several lanes: the cores shared among them)
        plan = plan_device(s, cfg, str(args.get("model_instance_kind", "CPU")),
                           int(args.get("model_instance_device_id", 0) or 0), executor_of(cfg))
        spec = None if s.whole_graph else parse_policy(s.policy)
        self.settings = s = dataclasses.replace(
            s, intra_op_threads=plan.intra_op_threads, use_per_session_threads=plan.per_session_threads,
            # one request at a time where the policy does not batch (serial)
            scheduler_max_batch_size=s.scheduler_max_batch_size if spec is None or spec.entry.batches else 1)
        self.device_group = plan.group  # "": none (docs/colocation.md)
        self.membership: Any = None  # its place there (backend/arbiter/join.py): solo, or the arbiter's gate
        self.metrics: ModelMetrics | None = None
        self.cpu_share: Any = None  # its member of the server's CPU share (backend/cpu_share.py), or None
        self.exporter: TritonMetricsExporter | None = None
        self.runtime: Any = None
        self._responder: ResponseThread | None = None  # sends the answers (response_thread, backend/responder.py)
        self._latches: dict[int, Latch] = {}  # batch_per_execute: request -> its execute call's latch
        self.logs = StatsLogs(s.name)  # LAZYBATCH_STATS_DIR's files, for benchmarks (backend/stats_logs.py)
        self.parts = ModelParts()  # what the model's kind builds (backend/model_kinds.py), below
        self._gpu_inputs: int | None = None  # the GPU whose inputs stay there (backend/input_tensors.py), or None
        self._threads_before = threads()  # the sessions' pool workers are the native threads started after this
        process_wide_onnxruntime(s, pb_utils)
        # the options of every request that sends no parameters (most do not): one object, shared and never
        # written, so that such a request skips their parsing on its path (a few us a call, in-process, ad hoc)
        plain, _ = parse_request_parameters("", s.sla_ms)  # no text: the model's SLA, never an error
        self._plain_options = dataclasses.replace(plain, priority=s.request_level(0)[0])
        # ... and those of each parameter text seen (a client sends the same with every request, `lazybatch load`
        # its SLA), checked once: shared, never written; a deadline (absolute) is checked at every request
        self._options: dict[str, RequestOptions] = {}
        batch_log = self.logs.batches.record if self.logs.batches else None
        # the GPU Triton assigned this instance (KIND_GPU); a CPU instance's id says nothing about a GPU
        device_id = int(args.get("model_instance_device_id", 0) or 0) if args.get("model_instance_kind") == "GPU" \
            else 0
        if spec is None:
            kind, runner = "whole_graph", None
        else:
            manifest = load_manifest(s.stage_dir)
            kind = model_kind(cfg, manifest)
            buckets, no_graphs = cuda_graph_buckets(s, kind)
            resident = kind in ("stages", "seq2seq") and wants_device_tensors(s)
            stream, no_stream = shared_stream(s, resident, device_id)
            runner = StageRunner(s.stage_dir, manifest=manifest, execution_provider=s.execution_provider,
                                 intra_op_threads=s.intra_op_threads, inplace_residuals=s.inplace_residuals,
                                 device_tensors=resident, device_id=device_id, graph_buckets=buckets, stream=stream)
            for line in runner.device_path_lines(no_graphs, no_stream):
                print(f"lazybatch: {s.name}: {line}", file=sys.stderr)
        self.parts = parts = MODEL_KINDS[kind](BuildInputs(s, cfg, spec, runner, plan.solo_threads, batch_log))
        if not parts.scheduled:
            return
        try:
            self._start(parts, cfg, spec, Path(args["model_repository"]).parent, batch_log,
                        str(args.get("model_instance_kind", "CPU")), executor_of(cfg))
        except BaseException:
            # A bad admission or fault-injection parameter fails the load: stop the scheduler and responder threads
            # started above, so that a model that did not load leaves nothing running in the stub.
            self.finalize()
            raise
        freeze_loaded_heap(pb_utils)

    def _start(self, parts: ModelParts, cfg: Any, spec: Any, server_dir: Path, batch_log: Any, instance_kind: str,
               executor: str) -> None:
        """The scheduler's runtime, built whole; then, for a grouped model, its place in the device group."""
        s = self.settings
        stage_names = [st.name for st in parts.runner.manifest.stages]
        fault = FaultInjector.parse(s.fault_injection, stage_names)
        self.cpu_share = self._cpu_share(parts, instance_kind, executor)
        if s.metrics:
            self.metrics = ModelMetrics(s.name, stage_names, s.scheduler_max_batch_size,
                                        seq2seq=parts.seq2seq is not None,  # + the decoder loop's families
                                        device=bool(self.device_group),  # + the shared device's (arbiter gate)
                                        cpu_share=self.cpu_share)  # + the CPU share's
            if pb_utils is not None:  # outside Triton (unit tests) the bookkeeping runs, nothing is exported
                self.exporter = TritonMetricsExporter(self.metrics, pb_utils, s.metrics_interval_ms / 1e3)
        stats = self.logs.stats_file({"model": s.name, "policy": s.policy, "fused": parts.fused,
                                      "device_tensors": getattr(parts.runner, "resident", None) is not None,
                                      "cuda_graph_stages": len(getattr(parts.runner, "graphs", {})),
                                      "shared_cuda_stream": getattr(parts.runner, "stream", None) is not None},
                                     lambda: self.gate)
        inline_ok = parts.whole is not None and self._inline_allowed(cfg)
        if parts.seq2seq is None:  # (the decoder loop reads token values on the host)
            self._gpu_inputs = keeps_gpu_inputs(getattr(parts.runner, "resident", None), inline_ok)
        membership = None

        def alone() -> bool:  # no other member of the device group active (arbiter/join.py)
            return membership is None or membership.alone()

        self._responder = ResponseThread(self._respond, name=f"{s.name}-responder") if s.response_thread else None
        self.runtime = parts.runtime_cls(
            parts.runner, parts.table, parts.policy, self._responder or self._respond,
            is_cancelled=self._is_cancelled, cancel_poll_s=s.cancel_poll_ms / 1e3, name=s.name,
            on_idle=stats.write if stats is not None else None, on_batch=batch_log,
            queue_policy=QueuePolicy(s.max_queue_size, s.timeout_action), metrics=self.metrics, fault=fault,
            whole_runner=parts.whole, whole_wide=parts.whole_wide, alone=alone, inline=inline_ok,
            # fixed by the config: not measured
            measure_boundary_cost="boundary_cost_us" not in spec.params,
            memory_release_s=s.memory_release_ms / 1e3, park=self.cpu_share.park if self.cpu_share else None)
        if self.device_group:  # co-located models: the device's decisions are the group's arbiter's
            from .arbiter.join import Membership

            metrics = self.metrics

            def on_gate(gate: Any) -> None:  # its device time and wait, read at each push
                if metrics is not None:
                    metrics.read_device_from(gate)

            self.membership = membership = Membership(
                self.runtime, self.device_group, server_dir, s.name, weight=s.device_weight,
                priority=s.device_priority_level, max_queue_size=s.device_max_queue_size, inline_ok=inline_ok,
                lanes=s.device_lanes, on_gate=on_gate)

    def _cpu_share(self, parts: ModelParts, instance_kind: str, executor: str) -> Any:
        """Its member of the server's CPU share (backend/cpu_share.py), or None: opted out, in a device group (its
        arbiter takes turns), or not computing on the CPU."""
        s = self.settings
        on_cpu = instance_kind.upper() != "GPU" and executor != "npu" and \
            all(p == "CPUExecutionProvider" for p in parts.runner.providers)
        if s.cpu_share == "none" or self.device_group or not on_cpu:
            return None
        from lazybatch.batcher.cpu_rank import ShareMember, nice_steps

        from .cpu_share import CpuShare
        from .pool_park import PoolPark, new_native_threads

        park = PoolPark(new_native_threads(self._threads_before, threads())) if s.cpu_share_park else None
        try:
            return CpuShare(ShareMember(s.name, s.sla_ms, s.cpu_share, s.cpu_share_split),
                            steps=nice_steps(s.cpu_share_nice), park=park)
        except OSError as e:  # never fails a load: the model serves as an unshared one
            print(f"lazybatch: {s.name}: cpu_share off: cannot join the server's CPU share ({e})", file=sys.stderr)
            return None

    def _inline_allowed(self, cfg: Any) -> bool:
        """Whether whole passes may run in execute (``InlineRoute.run``): only where Triton's dynamic
        batcher hands execute everything that queued meanwhile (without it, each execute would hold one request
        and inline passes would serve the queue one by one), with no queue delay of its own (a delay would come on
        top of ours), and where nothing needs the scheduler to see every request (REJECT admission, fault
        injection)."""
        s = self.settings
        why = None
        if not cfg.HasField("dynamic_batching"):
            why = "config.pbtxt has no dynamic_batching section"
        elif cfg.dynamic_batching.max_queue_delay_microseconds:
            why = "dynamic_batching has a max_queue_delay_microseconds"
        elif s.timeout_action == "REJECT" or s.max_queue_size:
            why = "admission control (max_queue_size, timeout_action: REJECT) sees every request"
        elif s.fault_injection:
            why = "fault_injection is set"
        elif s.decoupled:
            why = "the model is decoupled (execute may not return responses)"
        if why:
            print(f"lazybatch: {s.name}: whole passes run through the scheduler thread, not inline ({why})",
                  file=sys.stderr)
        return why is None

    @property
    def gate(self) -> Any:
        """The arbiter gate of a grouped model once it joined the arbiter (None: solo, or no group)."""
        return self.membership.gate if self.membership is not None else None

    # ------------------------------------------------------------------ Triton calls
    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.runtime is None:
            return self._execute_whole_graph(requests)
        if self.cpu_share is not None:
            self.cpu_share.note_active()
        seq2seq = self.parts.seq2seq
        s = self.settings
        good: list[tuple[Any, dict[str, np.ndarray], int, Any]] = []
        for request in requests:
            tensors = read_inputs(request, self._gpu_inputs, need_values=not s.allow_nan)
            batch, err = (seq2seq.validate(tensors, s.max_batch_size) if seq2seq is not None else
                          validate_request(tensors if self._gpu_inputs is None else described(tensors), s.inputs,
                                           s.max_batch_size, s.allow_nan))
            opts = None
            if err is None:
                text = request.parameters()
                if not text or text == "{}":  # no scheduling parameters: the model's defaults, already checked
                    opts = self._plain_options
                else:
                    opts = self._options.get(text) if type(text) is str else None
                    if opts is None:
                        opts, err = self._parse_options(text)
            if err is None:
                good.append((request, tensors, batch, opts))
                continue
            if self.metrics is not None:
                self.metrics.request_done(INVALID)
            request.get_response_sender().send(_error_response(err),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if not good:
            return None
        outputs = None
        route = self.runtime.route  # the inline route (backend/inline.py): whole passes run here, in execute
        if route.on:
            if len(requests) == 1 and good:  # the common case below capacity, kept short: one request, one pass
                _, tensors, batch, opts = good[0]
                out = route.run_one(tensors, batch, opts)
                if out is not None:
                    return [self._response(out)]
            else:
                def early(i: int, out: Any) -> None:  # a pass before the group's last: its answers go now
                    good[i][0].get_response_sender().send(self._response(out),
                                                          flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

                outputs = route.run_group([(g[1], g[2]) for g in good], early, [g[3] for g in good])
        if outputs is not None:  # the rest answered with the end of execute, one message (as Triton's backends)
            if len(good) == len(requests):  # every request valid: the answers in the requests' order
                return [None if out is None else self._response(out) for out in outputs]
            answers = {id(g[0]): self._response(out) for g, out in zip(good, outputs) if out is not None}
            return [answers.get(id(r)) for r in requests]
        latch = Latch(len(good)) if s.batch_per_execute else None
        if latch is not None:  # counted down by _respond as each request is answered
            for g in good:
                self._latches[id(g[0])] = latch
        for (request, *_), err in zip(good, self.runtime.submit_group(good)):  # one arrival: seen together
            if err is not None:
                if latch is not None:
                    del self._latches[id(request)]
                    latch.count_down()
                if self.metrics is not None:
                    self.metrics.request_done(INVALID)
                request.get_response_sender().send(_error_response(err),
                                                   flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if latch is not None:
            # batch_per_execute: this group is Triton's batch, served to its end before Triton may call execute
            # again (the whole decode loop in one execute, as a model with its own loop under Triton's batcher)
            latch.wait()
        return None

    def finalize(self) -> None:
        if self.runtime is not None:
            self.runtime.close()  # answers every request it holds (queued to the responder)
        if self.membership is not None:
            self.membership.close()
        if self.cpu_share is not None:
            self.cpu_share.close()  # every thread back to its weight
        if self._responder is not None:
            self._responder.close()  # ... and those answers are sent before the model goes
        if self.exporter is not None:
            self.exporter.close()
        self.logs.close()
        if self.parts.segment_dir is not None:
            shutil.rmtree(self.parts.segment_dir, ignore_errors=True)

    # ------------------------------------------------------------------ helpers
    def _parse_options(self, text: Any) -> tuple[Any, str | None]:
        """A request's scheduling options from its parameter text, or why they are refused; kept by text where they
        hold no deadline (``_options``, at most OPTIONS_KEPT texts)."""
        s = self.settings
        opts, err = parse_request_parameters(text, s.sla_ms)
        if err is None:
            opts.priority, err = s.request_level(opts.priority)
        if err is None and opts.deadline_unix_s is None and type(text) is str:
            if len(self._options) >= OPTIONS_KEPT:
                self._options.clear()
            self._options[text] = opts
        return opts, err if err is not None else check_deadline(opts)

    @staticmethod
    def _response(out: "dict[str, np.ndarray] | str") -> Any:
        """An inline pass's answer: its outputs, or the error it failed with."""
        if isinstance(out, str):
            return _error_response(f"onnxruntime failed: {out}", "INTERNAL")
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, np.ascontiguousarray(v))
                                                          for k, v in out.items()])

    def _respond(self, request: Any, outputs: dict[str, np.ndarray] | None, status: Status,
                 error: str | None, final: bool = True) -> None:
        """Send an answer; ``final`` False is a streamed part of it (decoupled seq2seq models)."""
        if outputs is not None:
            resp = self._response(outputs)
            if not final:
                request.get_response_sender().send(resp)
                return
        else:
            te = pb_utils.TritonError
            code = _error_code(status)
            err = te(error or status.value, code) if code is not None else te(error or status.value)
            resp = pb_utils.InferenceResponse(output_tensors=[], error=err)
        # the id is read before the final send: after it the server may release the request
        rid = request.request_id() if status is Status.CANCELLED and self.logs.cancels is not None else None
        latch = self._latches.pop(id(request), None)
        try:
            request.get_response_sender().send(resp, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            if latch is not None:
                latch.count_down()
        if rid is not None:
            self.logs.cancels.record_cancel(rid)

    @staticmethod
    def _is_cancelled(request: Any) -> bool:
        return bool(request.is_cancelled())

    def _execute_whole_graph(self, requests: list[Any]) -> list[Any]:
        """No scheduler: every valid request of Triton's group in one whole-graph run (backend/whole_graph.py)."""
        s = self.settings
        responses: list[Any] = [None] * len(requests)
        good: list[tuple[int, dict[str, np.ndarray], int]] = []
        for i, request in enumerate(requests):
            tensors = read_inputs(request, None)  # a whole-graph session.run: host arrays
            batch, err = validate_request(tensors, s.inputs, s.max_batch_size, s.allow_nan)
            if err is not None:
                responses[i] = _error_response(err)
            else:
                good.append((i, tensors, batch))
        if good:
            answers = self.parts.whole_graph.run([(t, b) for _, t, b in good])
            for k, (i, _, _) in enumerate(good):
                responses[i] = (_error_response(f"onnxruntime failed: {answers}", "INTERNAL")
                                if isinstance(answers, str) else self._response(answers[k]))
        return responses
