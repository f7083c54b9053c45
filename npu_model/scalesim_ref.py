"""Run SCALE-Sim 3.0.0 (``pip install scalesim==3.0.0``, the ``npu-validate`` extra) on convolution layers.

Only the validation benchmark and ``lazybatch npu validate`` use this; the timing model never imports scalesim.
SCALE-Sim is driven as its own CLI drives it: a config file, a topology CSV (padded input size, kernel, channels,
filters, stride) and a layout file, written to a scratch directory; traces are not saved. Bandwidth mode is CALC
(SCALE-Sim estimates the bandwidth that avoids stalls), so its cycle count is the array's compute cycles, which is
what ``systolic.array_cycles`` models.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import onnx
from onnx import helper

from lazybatch.batcher.errors import ConfigError

from .config import NPUConfig
from .systolic import ConvLayer

CONFIG = """[general]
run_name = lazybatch_{name}

[architecture_presets]
ArrayHeight: {rows}
ArrayWidth: {cols}
IfmapSramSzkB: {ifmap_kb}
FilterSramSzkB: {filter_kb}
OfmapSramSzkB: {ofmap_kb}
IfmapOffset: 0
FilterOffset: 10000000
OfmapOffset: 20000000
Dataflow : {dataflow}
Bandwidth : 10
ReadRequestBuffer: 32
WriteRequestBuffer: 32

[layout]
IfmapCustomLayout: False
IfmapSRAMBankBandwidth: 10
IfmapSRAMBankNum: 10
IfmapSRAMBankPort: 2
FilterCustomLayout: False
FilterSRAMBankBandwidth: 10
FilterSRAMBankNum: 10
FilterSRAMBankPort: 2

[sparsity]
SparsitySupport : false
SparseRep : ellpack_block
OptimizedMapping : false
BlockSize : 8
RandomNumberGeneratorSeed : 40

[run_presets]
InterfaceBandwidth: CALC
UseRamulatorTrace: False
"""


@dataclass
class ScaleSimResult:
    layer: ConvLayer
    cycles: int  # SCALE-Sim's total cycles (index of the last busy cycle, CALC mode: no stalls)
    stall_cycles: int
    seconds: float  # wall time SCALE-Sim took for this layer


def _import_scalesim():
    try:
        from scalesim.scale_sim import scalesim  # noqa: F401
    except ImportError:
        raise ConfigError("SCALE-Sim is not installed; `pip install 'lazybatch[npu-validate]'` (scalesim==3.0.0)",
                          field="scalesim") from None
    return scalesim


def run_layer(layer: ConvLayer, cfg: NPUConfig, *, dataflow: str | None = None,
              workdir: str | Path | None = None) -> ScaleSimResult:
    """One SCALE-Sim run for one layer with the array, SRAM sizes and dataflow of ``cfg``."""
    scalesim = _import_scalesim()
    if layer.groups != 1:
        raise ConfigError(f"layer {layer.name}: grouped convolutions are not validated against SCALE-Sim")
    df = dataflow or cfg.dataflow
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        d = Path(tmp)
        # SCALE-Sim has one ifmap and one ofmap SRAM; Table I's activation SRAM is split between them.
        act_kb = cfg.act_sram_bytes // 1024
        (d / "npu.cfg").write_text(CONFIG.format(name=layer.name, rows=cfg.rows, cols=cfg.cols,
                                                 ifmap_kb=act_kb // 2, ofmap_kb=act_kb // 2,
                                                 filter_kb=cfg.wgt_sram_bytes // 1024, dataflow=df))
        (d / "topo.csv").write_text(
            "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, "
            f"Stride Height,\n{layer.name}, {layer.h}, {layer.w}, {layer.r}, {layer.s}, {layer.c}, {layer.m}, "
            f"{layer.stride},\n")
        (d / "layout.csv").write_text("Layer name,\n")
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            sim = scalesim(save_disk_space=True, verbose=False, config=str(d / "npu.cfg"),
                           topology=str(d / "topo.csv"), layout=str(d / "layout.csv"))
            sim.run_scale(top_path=str(d / "out"))
        seconds = time.perf_counter() - t0
        items = sim.runner.single_layer_sim_object_list[0].get_compute_report_items()
    return ScaleSimResult(layer, int(items[1]), int(items[2]), seconds)


def conv_layers(model: str | Path | onnx.ModelProto) -> list[ConvLayer]:
    """Every Conv node of a (batch-1, statically shaped) ONNX model as a SCALE-Sim layer with padded input size."""
    from .onnx_front import OnnxModel

    om = OnnxModel(model) if not isinstance(model, OnnxModel) else model
    out = []
    for nd in om.nodes(1):
        if nd.op != "Conv":
            continue
        x, w = nd.inputs[0], nd.inputs[1]
        pads = [0, 0, 0, 0]
        for a in nd.attrs.attribute:
            if a.name == "pads":
                pads = list(helper.get_attribute_value(a))
        strides = [1, 1]
        for a in nd.attrs.attribute:
            if a.name == "strides":
                strides = list(helper.get_attribute_value(a))
        group = 1
        for a in nd.attrs.attribute:
            if a.name == "group":
                group = int(helper.get_attribute_value(a))
        if strides[0] != strides[1]:
            raise ConfigError(f"{nd.name}: SCALE-Sim takes one stride; got {strides}")
        out.append(ConvLayer(nd.name, x[2] + pads[0] + pads[2], x[3] + pads[1] + pads[3], w[2], w[3], x[1], w[0],
                             strides[0], group))
    return out


def unique_layers(layers: Sequence[ConvLayer]) -> list[tuple[ConvLayer, int]]:
    """Distinct layer shapes with how often each occurs (identical shapes give identical cycle counts)."""
    seen: dict[tuple, list] = {}
    for l in layers:
        key = (l.h, l.w, l.r, l.s, l.c, l.m, l.stride, l.groups)
        if key in seen:
            seen[key][1] += 1
        else:
            seen[key] = [l, 1]
    return [(l, n) for l, n in seen.values()]
