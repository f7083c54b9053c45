"""The systolic-array model against cycle counts computed by hand (and checked once against SCALE-Sim 3.0.0)."""

from __future__ import annotations

import pytest

from lazybatch.batcher.errors import ConfigError
from lazybatch.npu_model import ConvLayer, Gemm, NPUConfig, array_cycles, conv_cost, gemm_cost
from lazybatch.npu_model.config import parse_array
from lazybatch.npu_model.energy import DRAM_PJ_PER_BYTE, SRAM_PJ_PER_BYTE
from lazybatch.npu_model.systolic import dram_bytes, sram_bytes

SMALL = NPUConfig(rows=2, cols=2)
EIGHT = NPUConfig(rows=8, cols=8)


def test_tiny_gemm_by_hand_both_dataflows():
    g = Gemm(m=3, k=2, n=3)
    # OS: ceil(3/2) * ceil(3/2) = 4 folds, each K + R + C - 2 = 2 + 2 + 2 - 2 = 4 cycles
    assert array_cycles(g, SMALL, "os") == 16
    # WS: ceil(K/2) * ceil(N/2) = 1 * 2 folds, each 2R + C + M - 2 = 4 + 2 + 3 - 2 = 7 cycles
    assert array_cycles(g, SMALL, "ws") == 14


@pytest.mark.parametrize("layer, os_cycles, ws_cycles", [
    # 10x10x4 input, 3x3 kernel, 12 filters, stride 1: 8x8 = 64 output pixels, window 36.
    # OS: ceil(64/8) * ceil(12/8) * (36 + 8 + 8 - 2) = 16 * 50; WS: ceil(36/8) * ceil(12/8) * (16 + 8 + 64 - 2) = 10 * 86
    (ConvLayer("c1", 10, 10, 3, 3, 4, 12, 1), 800, 860),
    # 7x7x20, 1x1 kernel, 5 filters, stride 2: 4x4 = 16 pixels, window 20.
    # OS: 2 * 1 * (20 + 14) = 68; WS: ceil(20/8) * 1 * (16 + 8 + 16 - 2) = 3 * 38 = 114
    (ConvLayer("c2", 7, 7, 1, 1, 20, 5, 2), 68, 114),
])
def test_conv_by_hand_matches_scalesim(layer, os_cycles, ws_cycles):
    """SCALE-Sim 3.0.0 on an 8x8 array reported 799/859 and 67/113 for these layers: the index of the last busy
    cycle, one less than the number of cycles."""
    assert array_cycles(layer.gemm(), EIGHT, "os") == os_cycles
    assert array_cycles(layer.gemm(), EIGHT, "ws") == ws_cycles


def test_batch_multiplies_rows_of_the_im2col_matrix():
    layer = ConvLayer("c", 10, 10, 3, 3, 4, 12, 1)
    assert layer.gemm(3).m == 3 * 64
    # OS: 3 * 64 pixels over 8 rows = 24 row folds
    assert array_cycles(layer.gemm(3), EIGHT, "os") == 24 * 2 * 50


def test_grouped_gemm_is_groups_times_one():
    one = array_cycles(Gemm(5, 7, 9), EIGHT, "ws")
    assert array_cycles(Gemm(5, 7, 9, groups=6), EIGHT, "ws") == 6 * one


def test_sram_traffic_by_hand():
    g = Gemm(m=3, k=2, n=3)  # A 6, B 6, C 9 elements on a 2x2 array
    # OS: A once per column fold (2), B once per row fold (2), C written once
    assert sram_bytes(g, SMALL, "os") == 6 * 2 + 6 * 2 + 9
    # WS: B once, A once per column fold (2), C once per row fold (1)
    assert sram_bytes(g, SMALL, "ws") == 6 + 6 * 2 + 9


def test_weights_stream_once_when_activations_fit():
    cfg = NPUConfig(rows=8, cols=8, act_sram_bytes=1 << 20, wgt_sram_bytes=1024)
    traffic, tiles = dram_bytes(Gemm(m=64, k=64, n=64), cfg)
    assert traffic == 64 * 64  # weights only; 4096 B in 512 B tiles (half of 1 KiB, double buffered)
    assert tiles == 8


def test_tiling_refetches_when_nothing_fits():
    cfg = NPUConfig(rows=8, cols=8, act_sram_bytes=1024, wgt_sram_bytes=1024)
    traffic, tiles = dram_bytes(Gemm(m=64, k=64, n=64), cfg)
    a = b = o = 4096
    # 8 weight tiles of 512 B; the inputs (8 tiles too) are re-read once per weight tile (or vice versa); + output
    assert tiles == 8
    assert traffic == min(b + a * 8, a + b * 8) + o
    # a bigger weight SRAM means fewer refetches
    bigger, _ = dram_bytes(Gemm(m=64, k=64, n=64), cfg.replace(wgt_sram_bytes=8192))
    assert bigger == b + a + o


def test_two_byte_data_doubles_traffic():
    g = Gemm(m=64, k=64, n=64)
    cfg = NPUConfig(act_sram_bytes=1024, wgt_sram_bytes=1024)
    t1, _ = dram_bytes(g, cfg)
    t2, _ = dram_bytes(g, cfg.replace(dtype_bytes=2, act_sram_bytes=2048, wgt_sram_bytes=2048))
    assert t2 == 2 * t1


def test_roofline_memory_bound_gemv():
    cfg = NPUConfig(dram_bw_bytes_s=1e9)  # 1 GB/s at 700 MHz: 1/0.7 bytes per cycle
    c = gemm_cost(Gemm(m=1, k=4096, n=4096), cfg)
    assert c.bound == "memory"
    assert c.dram_bytes == 4096 * 4096
    assert c.memory_cycles == pytest.approx(4096 * 4096 / (1e9 / 700e6))
    assert c.cycles == pytest.approx(c.memory_cycles + 100)  # + one exposed memory latency


def test_roofline_compute_bound_conv():
    layer = ConvLayer("l", 58, 58, 3, 3, 64, 64, 1)
    c = conv_cost(layer, NPUConfig(), 1)
    assert c.bound == "compute"
    assert c.array_cycles == array_cycles(layer.gemm(), NPUConfig())
    assert c.cycles == c.array_cycles + 100
    assert c.dram_bytes == 3 * 3 * 64 * 64  # the weights; activations stay in SRAM
    assert 0 < c.utilization(NPUConfig()) <= 1


def test_energy_is_the_documented_sum():
    cfg = NPUConfig()
    c = gemm_cost(Gemm(m=128, k=128, n=128), cfg)
    expect = c.macs * 0.23 + c.sram_bytes * SRAM_PJ_PER_BYTE + c.dram_bytes * DRAM_PJ_PER_BYTE
    assert c.energy_pj == pytest.approx(expect)
    assert gemm_cost(Gemm(m=128, k=128, n=128), cfg.replace(dtype_bytes=4)).energy_pj > c.energy_pj


def test_latency_never_falls_with_batch():
    layer = ConvLayer("l", 30, 30, 3, 3, 128, 128, 1)
    for df in ("os", "ws"):
        cfg = NPUConfig(dataflow=df)
        lat = [conv_cost(layer, cfg, b).cycles for b in (1, 2, 4, 8, 16, 32, 64)]
        assert lat == sorted(lat)
        # and batching pays: per-sample latency at 64 is below batch 1's
        assert lat[-1] / 64 < lat[0]


def test_table_i_defaults():
    cfg = NPUConfig()
    assert (cfg.rows, cfg.cols, cfg.freq_hz, cfg.mem_channels, cfg.mem_latency_cycles) == (128, 128, 700e6, 8, 100)
    assert (cfg.act_sram_bytes, cfg.wgt_sram_bytes, cfg.dram_bw_bytes_s) == (8 << 20, 4 << 20, 360e9)


@pytest.mark.parametrize("changes, field", [
    ({"dataflow": "is"}, "dataflow"), ({"rows": 0}, "rows"), ({"dtype_bytes": 3}, "dtype_bytes"),
    ({"dram_bw_bytes_s": -1.0}, "dram_bw_bytes_s"), ({"mem_latency_cycles": -5}, "mem_latency_cycles"),
    ({"cols": 1.5}, "cols"), ({"weight_prefetch": "yes"}, "weight_prefetch"),
])
def test_malformed_config_names_the_field(changes, field):
    with pytest.raises(ConfigError, match=field):
        NPUConfig(**changes)


def test_config_from_dict_refuses_unknown_keys():
    assert NPUConfig.from_dict({"rows": 32}).rows == 32
    with pytest.raises(ConfigError, match="unknown keys"):
        NPUConfig.from_dict({"row": 32})
    with pytest.raises(ConfigError):
        NPUConfig.from_dict([1, 2])


def test_parse_array():
    assert parse_array("256x64") == (256, 64)
    for bad in ("128", "axb", "0x4", "1x2x3"):
        with pytest.raises(ConfigError):
            parse_array(bad)


def test_weight_prefetch_by_hand():
    cfg = NPUConfig(rows=8, cols=8, weight_prefetch=True)
    # GEMV M=1, K=16, N=16 on 8x8: 2 x 2 = 4 tiles of max(1, 8) = 8 cycles, + first load 8 + drain 8 + 8 - 2
    assert array_cycles(Gemm(m=1, k=16, n=16), cfg, "ws") == 8 + 4 * 8 + 14
    # without prefetch: 4 folds of 2R + C + M - 2 = 16 + 8 + 1 - 2 = 23
    assert array_cycles(Gemm(m=1, k=16, n=16), cfg.replace(weight_prefetch=False), "ws") == 4 * 23
    # long input streams hide the loads: M = 100 -> 4 x 100 + 22
    assert array_cycles(Gemm(m=100, k=16, n=16), cfg, "ws") == 8 + 400 + 14
    # OS ignores it
    assert array_cycles(Gemm(m=3, k=2, n=3), SMALL.replace(weight_prefetch=True), "os") == 16
