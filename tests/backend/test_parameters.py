"""The config.pbtxt schema (backend/parameters.py) is the one place a parameter is defined: the docs' tables are
generated from it, every parameter the backend reads is in it, every one in it is read, and an absent parameter
takes the schema's default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lazybatch.backend import parameters as P
from lazybatch.backend import parameters_docs as D
from lazybatch.backend.settings import BackendSettings
from lazybatch.backend.config_pbtxt import parse_config_text

ROOT = Path(__file__).resolve().parents[2]
READERS = [ROOT / "backend" / "settings.py", ROOT / "backend" / "npu_executor.py"]
MINIMAL = '''
name: "m" backend: "python" max_batch_size: 4
input { name: "x" data_type: TYPE_FP32 dims: [ 16 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 8 ] }
'''


def test_docs_tables_are_the_schemas():
    page = (ROOT / "docs" / "triton.md").read_text()
    section = D.docs_section(page)
    assert section is not None, "docs/triton.md lost its generated parameter tables' markers"
    assert section == D.markdown(), "docs/triton.md's tables differ from backend/parameters.py: run " \
                                    "python -m lazybatch.backend.parameters_docs --write"
    for p in P.SCHEMA:
        assert f"| `{p.name}` |" in section


def _read_keys() -> set[str]:
    keys: set[str] = set()
    for f in READERS:
        text = f.read_text()
        keys |= set(re.findall(r'_(?:param|given)\(cfg, "([A-Za-z_]+)"', text))
        keys |= set(re.findall(r'^        "([a-z_]+)": \((?:float|int),', text, re.M))  # the device checks' table
    return keys


def test_every_parameter_read_is_in_the_schema_and_every_one_in_it_is_read():
    read = _read_keys()
    assert read - set(P.BY_NAME) == set(), "read by the backend but not in backend/parameters.py"
    # the seq2seq limits are written for clients and checked against the manifest (seq2seq_spec.py); the rest are
    # read by the settings parser or the NPU executor
    elsewhere = {"max_source_length", "max_output_length", "vocab_size", "length_histogram", "example_dims",
                 "FORCE_CPU_ONLY_INPUT_TENSORS"}
    assert set(P.BY_NAME) - read - elsewhere == set(), "in the schema but read nowhere"


def test_absent_parameters_take_the_schemas_defaults(tmp_path):
    s = BackendSettings.from_config(parse_config_text(MINIMAL), tmp_path / "1")
    booleans = {"profile_on_load", "allow_nan", "use_env_allocators", "inplace_residuals", "cuda_graphs",
                "shared_cuda_stream", "response_thread", "batch_per_execute", "metrics", "cpu_share_park",
                "cpu_share_split"}
    for name in booleans:
        assert getattr(s, name) is (P.default_value(name) == "true"), name
    for name in ("device_tensors", "fuse_stages", "cpu_share", "execution_provider", "timeout_action"):
        assert str(getattr(s, name)) == P.default_value(name), name
    for name in ("intra_op_threads", "fuse_segments", "max_queue_size", "priority_levels", "cpu_share_nice",
                 "stream_interval_tokens", "metrics_interval_ms", "memory_release_ms", "dec_timesteps_coverage",
                 "device_weight", "device_priority_level", "device_max_queue_size", "device_lanes"):
        assert float(getattr(s, name)) == float(P.default_value(name)), name
    assert s.stage_dir.name == P.default_value("stage_dir")
    assert s.latency_table.name == P.default_value("latency_table")
    assert s.whole_graph_model.name == P.default_value("whole_graph_model")


def test_a_schema_entry_needs_a_known_group():
    with pytest.raises(ValueError, match="group"):
        P.Parameter("x", "misc", None, "-", "a knob")


def test_repo_add_help_lists_what_a_deployment_sets_and_counts_the_levers():
    text = D.parameters_help()
    assert "policy" in text and "sla_ms" in text and "experiment levers" in text
    assert all(p.name not in text for p in P.SCHEMA if p.lever)
