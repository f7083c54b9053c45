"""backend/responder.py: answers leave the scheduler thread at once and reach their clients in order, all of them."""

from __future__ import annotations

import threading
import time

import pytest

from lazybatch.backend.settings import BackendSettings
from lazybatch.backend.config_pbtxt import parse_config_text
from lazybatch.backend.responder import ResponseThread
from lazybatch.batcher.errors import ConfigError


def test_the_caller_does_not_wait_for_a_slow_send_and_order_is_kept():
    release = threading.Event()
    got: list[int] = []

    def send(i: int) -> None:  # like pb_utils' send: waits for the other side
        release.wait(5)
        got.append(i)

    r = ResponseThread(send)
    t0 = time.perf_counter()
    for i in range(50):
        r(i)
    queued_in = time.perf_counter() - t0
    assert queued_in < 1.0 and got == []  # nothing sent yet, and the caller went on
    release.set()
    r.close()
    assert got == list(range(50)) and r.sent == 50 and r.failed == 0


def test_close_sends_everything_queued_and_a_late_answer_is_sent_inline():
    got: list[int] = []
    r = ResponseThread(lambda i: (time.sleep(0.001), got.append(i)))
    for i in range(20):
        r(i)
    r.close()
    assert got == list(range(20))
    r(99)  # after close (a runtime closed later): not dropped
    assert got[-1] == 99 and r.sent == 21
    r.close()  # twice is fine


def test_a_send_that_raises_does_not_stop_the_others(capsys):
    got: list[int] = []

    def send(i: int) -> None:
        if i == 3:
            raise RuntimeError("client went away")
        got.append(i)

    r = ResponseThread(send)
    for i in range(6):
        r(i)
    r.close()
    assert got == [0, 1, 2, 4, 5] and r.failed == 1
    assert "client went away" in capsys.readouterr().err


def _config(extra: str = ""):
    return parse_config_text('name: "m" backend: "python" max_batch_size: 4\n'
                             'input { name: "x" data_type: TYPE_FP32 dims: [ 16 ] }\n'
                             'output { name: "y" data_type: TYPE_FP32 dims: [ 8 ] }\n' + extra)


def test_response_thread_parameter(tmp_path):
    assert BackendSettings.from_config(_config(), tmp_path).response_thread is True
    off = 'parameters { key: "response_thread" value { string_value: "false" } }'
    assert BackendSettings.from_config(_config(off), tmp_path).response_thread is False
    with pytest.raises(ConfigError, match="response_thread"):
        BackendSettings.from_config(_config(off.replace("false", "maybe")), tmp_path)


@pytest.mark.parametrize("on", [True, False])
def test_model_sends_through_the_thread_unless_told_not_to(tmp_path, on):
    from tests.backendhelpers import initialize_model

    from lazybatch.repo import add_model
    from lazybatch.staging import make_mlp

    model = make_mlp(tmp_path / "mlp.onnx", depth=2, width=8)
    mdir = add_model(model, tmp_path / "repo", name="m", policy="lazy", max_batch_size=4, profile_reps=1,
                     execution_provider="cpu")
    m = initialize_model(mdir, response_thread=str(on).lower())
    try:
        assert (m._responder is not None) is on
        assert (m.runtime.respond is m._responder) if on else (m.runtime.respond == m._respond)
    finally:
        m.finalize()
    if on:
        assert not m._responder._thread.is_alive()  # finalize drained and stopped it


def test_a_model_that_fails_to_load_leaves_no_thread_running(tmp_path):
    import threading

    from tests.backendhelpers import initialize_model

    from lazybatch.repo import add_model
    from lazybatch.staging import make_mlp

    model = make_mlp(tmp_path / "mlp.onnx", depth=2, width=8)
    mdir = add_model(model, tmp_path / "repo", name="m", policy="lazy", max_batch_size=4, profile_reps=1,
                     execution_provider="cpu")
    with pytest.raises(ConfigError, match="neither a stage name nor an index"):
        initialize_model(mdir, fault_injection="stage=no_such_stage,every=2")  # fails after both threads started
    left = [t.name for t in threading.enumerate() if t.name in ("m-responder", "m-scheduler") and t.is_alive()]
    assert left == []
