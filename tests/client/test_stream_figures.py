"""The streaming client's time to first token and time per output token (client/stream.py) where a response carries
several tokens (config stream_interval_tokens K): the first part brings K tokens, and only the rest are timed per
token. No server: the client's own bookkeeping over parts given to it."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from lazybatch.client.stream import StreamClient, Streamed


Part = tuple[float, list[int], bool]  # (seconds after the send, its tokens, final)


class _Parts(StreamClient):
    """A stream client whose server is a list of parts."""

    def __init__(self, parts: list[Part]) -> None:  # no channel: nothing is sent
        self._given = parts

    async def parts(self, model, inputs, *, sla_ms=None, timeout_s=None):
        for _, toks, final in self._given:
            yield {"output_tokens": np.asarray([toks], dtype=np.int64),
                   "output_len": np.asarray([[len(toks)]], dtype=np.int64)}, final


def _generate(parts: list[Part], monkeypatch) -> Streamed:
    """Run ``generate`` with perf_counter reading the send at 0, then each part's own time as it arrives."""
    import lazybatch.client.stream as stream

    ticks = iter([0.0] + [at for at, _, _ in parts])
    monkeypatch.setattr(stream.time, "perf_counter", lambda: next(ticks))
    return asyncio.run(_Parts(parts).generate("lm", {"src_tokens": np.zeros((1, 3), np.int64)}))


def test_a_response_every_k_tokens_times_only_the_tokens_after_the_first_part(monkeypatch):
    # K = 4: parts of 4, 4 and 2 tokens at 10, 18 and 22 ms after the send
    a = _generate([(0.010, [1, 2, 3, 4], False), (0.018, [5, 6, 7, 8], False), (0.022, [9, 10], True)], monkeypatch)
    assert a.ok and a.n_tokens == 10 and a.parts == 3 and a.first_tokens == 4
    assert a.ttft_s == pytest.approx(0.010)
    assert a.tpot_s == pytest.approx(0.012 / 6)  # 6 tokens after the first part, 12 ms: not 12 ms / 9


def test_every_token_its_own_part_is_the_usual_time_per_token(monkeypatch):
    a = _generate([(0.005, [1], False), (0.007, [2], False), (0.009, [3], True)], monkeypatch)
    assert a.first_tokens == 1 and a.tpot_s == pytest.approx(0.002)


def test_an_answer_in_one_part_has_no_time_per_token(monkeypatch):
    a = _generate([(0.005, [1, 2, 3], True)], monkeypatch)
    assert a.ok and a.n_tokens == 3 and math.isnan(a.tpot_s)
