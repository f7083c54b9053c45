"""A request's scheduling options as ``execute`` reads them: the parameter text a client sends with every request is
checked once and its options kept (shared, never written), except where they carry a deadline, which is an
instant and is checked at every request; a text that fails its check fails every time it comes."""

from __future__ import annotations

import json
import time

import pytest

from lazybatch.repo import add_model
from lazybatch.staging import make_mlp
from tests.backendhelpers import initialize_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("opts")
    mdir = add_model(make_mlp(tmp / "mlp.onnx", depth=2, width=8), tmp / "repo", name="m", policy="eager",
                     max_batch_size=4, profile_reps=1, execution_provider="cpu")
    m = initialize_model(mdir, priority_levels="3", default_priority_level="2")
    yield m
    m.finalize()


def test_the_same_text_gets_the_options_checked_the_first_time(model):
    text = json.dumps({"sla_ms": 20, "request_priority": 1})
    first, err = model._parse_options(text)
    assert err is None and first.sla_s == pytest.approx(0.02) and first.priority == 1
    assert model._options[text] is first  # what execute reads for the next request with this text


def test_a_deadline_is_checked_at_every_request_and_never_kept(model):
    past = json.dumps({"deadline_unix_ms": (time.time() - 1.0) * 1e3})
    for _ in range(2):
        _, err = model._parse_options(past)
        assert err is not None and "deadline passed" in err
    future = json.dumps({"deadline_unix_ms": (time.time() + 60.0) * 1e3})
    opts, err = model._parse_options(future)
    assert err is None and opts.deadline_unix_s is not None
    assert past not in model._options and future not in model._options


def test_a_text_that_fails_its_check_is_not_kept(model):
    text = json.dumps({"request_priority": 7})  # outside the model's 3 levels
    _, err = model._parse_options(text)
    assert err is not None and "outside 1..3" in err
    assert text not in model._options
