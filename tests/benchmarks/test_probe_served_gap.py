"""The served-gap probe's command line: its variants are eager copies with the parameters asked for."""

from __future__ import annotations

import os

import pytest

from benchmarks.probes.probe_served_gap import POLICIES, main_thread_waits, variants


def test_variants_add_eager_copies_with_their_parameters():
    policies, parameters = variants(["noshare:cpu_share=none", "two:metrics=false,sla_ms=20"])
    assert policies == {**POLICIES, "eager_noshare": "eager", "eager_two": "eager"}
    assert parameters == {"eager_noshare": {"cpu_share": "none"}, "eager_two": {"metrics": "false", "sla_ms": "20"}}
    assert variants([]) == (POLICIES, {})


@pytest.mark.parametrize("bad", ["noshare", "noshare:", ":cpu_share=none", "noshare:cpu_share"])
def test_a_malformed_variant_says_the_form(bad):
    with pytest.raises(SystemExit, match="NAME:KEY=VALUE"):
        variants([bad])


def test_main_thread_waits_read_this_process():
    wait_ns, voluntary, involuntary = main_thread_waits(os.getpid())
    assert wait_ns >= 0 and voluntary >= 0 and involuntary >= 0
