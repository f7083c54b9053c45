"""The latency tables and length histogram the simulator ships, shaped after the LazyBatching paper.

No measured or NPU-modelled tables exist yet for the paper's models, so these are synthetic, built from what the
paper states (every number below says where it comes from):

* Single-input latency of the whole model (Table II): ResNet 1.1 ms, GNMT 7.2 ms, Transformer 2.4 ms. For the two
  seq2seq models this is taken at the mean input/output length of the default length histogram.
* Batch scaling per stage "flat then linear" (Fig. 3): latency(b) = L1 * max(1 + FLAT_SLOPE * (b - 1), b / knee).
  The knee is where throughput saturates: 16 for ResNet's convolutions (Fig. 3: "meaningless to batch beyond 16"),
  32 for the matrix-vector-bound RNN and attention decoder steps, 16 for the Transformer encoder.
* ResNet-50 stages: stem, the 16 bottleneck blocks, head; each stage's share of the latency follows its share of
  the multiply-accumulates (a downsampling block ~25% more than the others in its group).
* GNMT: embedding (STATIC), one encoder step (ENCODER: 8 LSTM layers), one decoder step (DECODER: attention, 8 LSTM
  layers, the vocabulary projection), a decoder step costing 1.6x an encoder step. Transformer: embedding, one
  encoder token (ENCODER), one decoder step (DECODER, 3x an encoder token, with a KV cache).
* Output lengths (Fig. 11, WMT-2019 En-De): about 70% of sentences under 20 words and about 90% within 30; we fit
  a log-normal (median 15.1 words, sigma 0.535) to those two points and tabulate it for lengths 1..80 (the paper's
  maximum sentence length) as counts out of 30,000 pairs. Input lengths are drawn from the same histogram.

``python -m lazybatch.simulator.paper_tables`` regenerates the files in ``data/``; a test checks they match.
"""

from __future__ import annotations

import math
from pathlib import Path

from lazybatch.batcher.graph import ModelGraph, StageType
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.formats.histograms import SHIPPED_HISTOGRAMS

DATA = Path(__file__).with_name("data")
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 48, 64]
FLAT_SLOPE = 0.02
HISTOGRAM_FILE = SHIPPED_HISTOGRAMS["wmt"]  # read back with lazybatch.formats.histograms.shipped_histogram()
MODELS = {"resnet50": "resnet50.json", "gnmt": "gnmt.json", "transformer": "transformer.json",
          "vgg19": "vgg19.json", "bert_base": "bert_base.json"}
ALIASES = {"resnet": "resnet50", "resnet-50": "resnet50", "vgg": "vgg19", "vgg-19": "vgg19", "bert": "bert_base",
           "bert-base": "bert_base"}
PAPER_MODELS = ("resnet50", "gnmt", "transformer")  # the LazyBatching paper's Table II


def scaling(l1: float, knee: float) -> list[float]:
    return [l1 * max(1 + FLAT_SLOPE * (b - 1), b / knee) for b in BATCH_SIZES]


def length_histogram() -> LengthHistogram:
    z70, z90 = 0.5244005127080407, 1.2815515655446004  # standard normal quantiles
    sigma = (math.log(30.5) - math.log(19.5)) / (z90 - z70)
    mu = math.log(19.5) - z70 * sigma
    lengths = list(range(1, 81))
    cdf = [0.5 * (1 + math.erf((math.log(x + 0.5) - mu) / (sigma * math.sqrt(2)))) for x in [0.5] + lengths]
    mass = [cdf[i + 1] - cdf[i] for i in range(len(lengths))]
    total = sum(mass)
    counts = [round(30000 * m / total) for m in mass]
    return LengthHistogram(lengths, counts, provenance=(
        "synthetic: log-normal fitted to the LazyBatching paper's Fig. 11 (WMT-2019 En-De, ~70% of sentences under "
        "20 words, ~90% within 30), lengths 1..80, counts out of 30,000 pairs"))


def resnet50() -> LatencyTable:
    groups = [(3, 0.23), (4, 0.24), (6, 0.24), (3, 0.24)]
    names, weights = ["stem"], [0.12]
    for g, (n, w) in enumerate(groups, start=1):
        for i in range(n):
            names.append(f"layer{g}.{i}")
            weights.append(w * (1.25 if i == 0 else 1.0))
    names.append("head")
    weights.append(0.01)
    total = sum(weights)
    graph = ModelGraph("resnet50", [(n, StageType.STATIC) for n in names])
    rows = [scaling(1.1e-3 * w / total, 16) for w in weights]
    return LatencyTable(graph, BATCH_SIZES, rows, provenance=(
        "synthetic, shaped after the LazyBatching paper: 1.1 ms single-input (Table II), per-stage share by MACs, "
        "flat-then-linear batch scaling with knee 16 (Fig. 3); see lazybatch/simulator/paper_tables.py"))


def _seq2seq(name: str, total: float, dec_ratio: float, enc_knee: float, dec_knee: float,
             embed_share: float) -> LatencyTable:
    mean_len = length_histogram().mean()
    embed = total * embed_share
    enc = (total - embed) / (mean_len * (1 + dec_ratio))
    dec = enc * dec_ratio
    graph = ModelGraph(name, [("embed", StageType.STATIC), ("encoder_step", StageType.ENCODER),
                              ("decoder_step", StageType.DECODER)])
    rows = [scaling(embed, 32), scaling(enc, enc_knee), scaling(dec, dec_knee)]
    return LatencyTable(graph, BATCH_SIZES, rows, meta={"calibrated_at_mean_length": round(mean_len, 3)},
                        provenance=(
        f"synthetic, shaped after the LazyBatching paper: {total * 1e3:g} ms single-input at the mean "
        f"length {mean_len:.1f} of the default histogram (Table II), decoder step {dec_ratio:g}x an encoder step, "
        f"flat-then-linear batch scaling (knees {enc_knee:g}/{dec_knee:g}, Fig. 3); "
        "see lazybatch/simulator/paper_tables.py"))


def gnmt() -> LatencyTable:
    return _seq2seq("gnmt", 7.2e-3, 1.6, 32, 32, 0.01)


def transformer() -> LatencyTable:
    return _seq2seq("transformer", 2.4e-3, 3.0, 16, 32, 0.02)


def vgg19() -> LatencyTable:
    """VGG-19 at the ResNet table's efficiency: 19.6 vs 4.1 GMACs -> 5.3 ms single-input; convolutions (knee 16),
    then three fully-connected layers, matrix-vector bound at batch 1 (knee 64)."""
    convs = [("conv1", 2), ("conv2", 2), ("conv3", 4), ("conv4", 4), ("conv5", 4)]
    gmacs = {"conv1": 1.94, "conv2": 2.77, "conv3": 5.55, "conv4": 5.55, "conv5": 1.85}
    names = [c for c, _ in convs] + ["fc6", "fc7", "fc8"]
    weights = [gmacs[c] for c, _ in convs] + [0.103, 0.017, 0.004]
    total = 5.3e-3
    per = [total * w / sum(weights) for w in weights]
    graph = ModelGraph("vgg19", [(n, StageType.STATIC) for n in names])
    rows = [scaling(p, 16) for p in per[:5]] + [scaling(p, 64) for p in per[5:]]
    return LatencyTable(graph, BATCH_SIZES, rows, provenance=(
        "synthetic, at the ResNet-50 table's MACs-per-second: 5.3 ms single-input for VGG-19's 19.6 GMACs, five "
        "conv groups (knee 16) and three FC layers (knee 64); see lazybatch/simulator/paper_tables.py"))


def bert_base() -> LatencyTable:
    """BERT-base encoder at sequence length 32: 12 layers x 32 tokens x 7.1 M MACs = 2.7 GMACs -> 0.73 ms at the
    ResNet table's efficiency; short sequences keep it matrix-vector-like (knee 32)."""
    names = ["embed"] + [f"layer{i}" for i in range(12)] + ["pooler"]
    weights = [0.01] + [1.0] * 12 + [0.02]
    total = 0.73e-3
    graph = ModelGraph("bert_base", [(n, StageType.STATIC) for n in names])
    rows = [scaling(total * w / sum(weights), 32) for w in weights]
    return LatencyTable(graph, BATCH_SIZES, rows, provenance=(
        "synthetic, at the ResNet-50 table's MACs-per-second: BERT-base encoder at sequence length 32, 0.73 ms "
        "single-input, 12 equal layers, knee 32; see lazybatch/simulator/paper_tables.py"))


BUILDERS = {"resnet50": resnet50, "gnmt": gnmt, "transformer": transformer, "vgg19": vgg19, "bert_base": bert_base}


def write_all(directory: Path = DATA) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = [BUILDERS[m]().save(directory / f) for m, f in MODELS.items()]
    out.append(length_histogram().save(directory / HISTOGRAM_FILE))
    return out


def shipped_table(name: str) -> LatencyTable:
    key = ALIASES.get(name.lower(), name.lower())
    return LatencyTable.load(DATA / MODELS[key])


if __name__ == "__main__":  # pragma: no cover
    for p in write_all():
        print(p)
