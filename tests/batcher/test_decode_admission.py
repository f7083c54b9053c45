"""Admission of decoder requests on the table's batch curves (batcher/decode_admission.py), the default policy's rule
for seq2seq and decoder-only graphs. Worked examples on a virtual clock."""

from __future__ import annotations

import pytest

from lazybatch.batcher.decisions import MERGE
from lazybatch.batcher.decode_admission import CurveAdmission, DecodeLengths
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.graph import ModelGraph, StageType
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.policies.lazy import Entry
from lazybatch.batcher.request import Request
from lazybatch.simulator.engine import Simulation

MS = 1e-3
SIZES = [1, 2, 4, 8]


def decoder_table(per_sample: float = 0.0) -> LatencyTable:
    """A prefill stage and a one-stage decoder loop, 1 ms each at batch 1; a batch of b costs 1 + per_sample (b - 1)."""
    g = ModelGraph("lm", [("prefill", StageType.STATIC), ("step", StageType.DECODER)])
    return LatencyTable(g, SIZES, [[(1 + per_sample * (b - 1)) * MS for b in SIZES] for _ in range(2)])


def test_conditional_length_follows_progress():
    """Uniform lengths 1-10: 90% of all requests end by 9 steps; one that has run 5 is expected to reach 10 (90% of
    the mass above 5 is at or below 10, 80% at or below 9); one past the longest length is given one more step."""
    h = LengthHistogram(list(range(1, 11)), [1.0] * 10)
    assert h.conditional_length(0, 0.9) == h.coverage_length(0.9) == 9
    assert h.conditional_length(5, 0.9) == 10
    assert h.conditional_length(5, 0.8) == 9
    assert h.conditional_length(12, 0.9) == 13
    with pytest.raises(ConfigError, match="coverage"):
        h.conditional_length(0, 0.0)


def test_the_curves_admit_where_eq2_refuses_and_both_deadlines_hold():
    """Batching free (a step at batch 2 costs what it costs at batch 1), 10 decoder steps, SLA 15 ms. Request 0 runs
    alone from 0 (prefill 1 ms, steps to 11 ms); request 1 arrives at 3.5 ms. Eq. 2 prices the pair as two single
    runs (4 + 7 + 11 = 22 ms past request 0's 15 ms deadline) and holds request 1 until 11 ms: it leaves at 22 ms,
    18.5 ms after it came. On the curves, its prefill at 4-5 ms and a shared decode leave request 0 at 12 ms and
    request 1 at 15 ms (11.5 ms after it came): both within the SLA."""
    def run(policy: str) -> list[Request]:
        reqs = [Request(0, 0.0, sla=15 * MS, dec_steps=10), Request(1, 3.5 * MS, sla=15 * MS, dec_steps=10)]
        Simulation(decoder_table(), parse_policy(policy).build(max_batch_size=8)).run(reqs)
        return reqs

    curves = run("eager:dec_timesteps=10")
    assert [r.finish / MS for r in curves] == pytest.approx([12.0, 15.0])
    assert all(r.latency <= r.sla for r in curves)
    eq2 = run("eager:dec_timesteps=10,admission=eq2")
    assert [r.finish / MS for r in eq2] == pytest.approx([11.0, 22.0])
    assert eq2[1].latency > eq2[1].sla


def test_the_shadow_run_predicts_the_schedule_exactly_when_lengths_are_as_predicted():
    """Encoder loop, a two-stage decoder loop and an output stage, batching at 30% a sample. Every request decodes the
    predicted 6 steps; four come at 0 and two at 12 ms, while the four decode (they preempt, encode, join the decode
    and leave it later than the four). From the last arrival on, the shadow run (loops crossed in one addition)
    predicts every finish at every stage boundary to the nanosecond."""
    g = ModelGraph("s2s", [("embed", StageType.STATIC), ("enc", StageType.ENCODER), ("dec_a", StageType.DECODER),
                           ("dec_b", StageType.DECODER), ("out", StageType.STATIC)])
    base = [0.5, 1.0, 0.7, 0.4, 0.3]
    table = LatencyTable(g, SIZES, [[c * (1 + 0.3 * (b - 1)) * MS for b in SIZES] for c in base])
    reqs = [Request(i, (0.0 if i < 4 else 12.0) * MS, sla=1.0, enc_steps=2 + i % 3, dec_steps=6) for i in range(6)]
    policy = parse_policy("eager:dec_timesteps=6").build(max_batch_size=8)
    predictions: list[dict[int, float]] = []

    def observe(t: float, job) -> None:
        if t > 12.0 * MS and not policy.infq:
            inflight = [r for e in policy.stack for r in e.reqs]
            slacks = policy.decoder.curves.slacks(t, policy.stack, (), policy.batch_cap, policy.time_scale)
            predictions.append({r.id: r.deadline - s for r, s in zip(inflight, slacks)})

    Simulation(table, policy, on_job=observe).run(reqs)
    assert len(predictions) > 15 and reqs[4].finish > reqs[0].finish
    assert policy.log.counts[MERGE] >= 1
    for p in predictions:
        for i, finish in p.items():
            assert finish == pytest.approx(reqs[i].finish, abs=1e-9)


def lost_and_newcomer(hist: LengthHistogram) -> tuple[int, float]:
    """Request 0 is decoding (step 3 of its expected run) with a deadline it can no longer meet; request 1 waits
    with a loose one."""
    table = decoder_table(per_sample=0.5)
    adm = CurveAdmission(table, DecodeLengths(hist, 0.9, 1))
    r0 = Request(0, 0.0, sla=2 * MS, dec_steps=20)
    r0.loop_iter = 3
    r1 = Request(1, 4 * MS, sla=1.0, dec_steps=20)
    return adm.admissible(5 * MS, [Entry(1, [r0], 0.0, r0.deadline)], [r1], room=7, cap=8, scale=1.0)


def test_a_lost_deadline_blocks_admission_only_where_lengths_vary_little():
    """Lengths 10-12 (squared CV near 0): finishing the work in flight first gives the lower mean, and the lost
    request may not be delayed: nothing is admitted. Lengths 1 or 100 (squared CV 7.4): sharing the steps does,
    and a deadline lost anyway does not hold the newcomer back."""
    light = LengthHistogram([10, 11, 12], [1.0, 1.0, 1.0])
    heavy = LengthHistogram([1, 100], [90.0, 10.0])
    assert DecodeLengths(light, 0.9, 1).lost_block and not DecodeLengths(heavy, 0.9, 1).lost_block
    assert DecodeLengths(heavy, 0.9, 1).cv2 == pytest.approx(7.42, abs=0.01)
    assert lost_and_newcomer(light)[0] == 0
    assert lost_and_newcomer(heavy)[0] == 1


def test_admission_is_a_policy_parameter_with_a_clear_error():
    assert parse_policy("eager:admission=eq2").build(max_batch_size=4).admission == "eq2"
    assert parse_policy("eager").build(max_batch_size=4).admission == "curves"
    assert parse_policy("eager:admission=first_token").build(max_batch_size=4).admission == "first_token"
    with pytest.raises(ConfigError, match="admission must be one of curves, eq2, first_token"):
        parse_policy("eager:admission=oracle").build(max_batch_size=4)


def test_first_token_admits_a_newcomer_the_curves_hold_behind_a_meetable_deadline():
    """A step at batch 2 costs 1.5 ms against 1 ms alone. Request 0 decodes 20 steps from 1 ms and must end by
    22 ms (21 ms alone); request 1 (5 steps, loose SLA) arrives at 3.5 ms. The curves hold it (its prefill and five
    shared steps would end request 0 at 24.5 ms), so its first token comes only after request 0's last one, at 23 ms.
    ``first_token`` (decoupled models' default) lets it in at the 4 ms boundary: prefill to 5 ms, a shared step to
    6.5 ms, its first token 3 ms after it came; request 0 pays 3.5 ms and misses its deadline."""
    def run(admission: str) -> list[Request]:
        reqs = [Request(0, 0.0, sla=22 * MS, dec_steps=20), Request(1, 3.5 * MS, sla=1.0, dec_steps=5)]
        table = decoder_table(per_sample=0.5)
        Simulation(table, parse_policy(f"eager:dec_timesteps=20,admission={admission}").build(max_batch_size=8)
                   ).run(reqs)
        return reqs

    curves = run("curves")
    assert curves[1].first_token / MS == pytest.approx(23.0)
    assert curves[0].finish / MS == pytest.approx(21.0) and curves[0].latency <= curves[0].sla
    first = run("first_token")
    assert first[1].first_token / MS == pytest.approx(6.5)
    assert first[0].first_token / MS == pytest.approx(2.0)  # its first step, 1-2 ms, before request 1 came
    assert first[0].finish / MS == pytest.approx(24.5) and first[0].latency > first[0].sla


def test_first_token_admits_no_more_than_the_batch_cap_leaves_room_for():
    """Cap 2: request 0 decodes; three newcomers wait at the 3 ms boundary. One joins (room 1); the others start
    only as rows leave, two steps' worth of tokens later at the earliest."""
    reqs = [Request(0, 0.0, sla=1.0, dec_steps=10)] + [Request(i, 2.5 * MS, sla=1.0, dec_steps=3) for i in (1, 2, 3)]
    policy = parse_policy("eager:dec_timesteps=10,admission=first_token").build(max_batch_size=2)
    most = 0

    def observe(t: float, job) -> None:
        nonlocal most
        most = max(most, sum(len(e.reqs) for e in policy.stack))

    Simulation(decoder_table(per_sample=0.5), policy, on_job=observe).run(reqs)
    assert most == 2
    assert reqs[1].first_token < reqs[2].first_token and reqs[1].first_token < reqs[3].first_token
    assert all(r.status.name == "OK" for r in reqs)


def encoder_decoder_table() -> LatencyTable:
    """An encoder loop and a decoder loop, one stage each: 1 ms at batch 1, 1.1 ms at batch 2 (cheap batching)."""
    g = ModelGraph("s2s", [("enc", StageType.ENCODER), ("step", StageType.DECODER)])
    return LatencyTable(g, SIZES, [[(1 + 0.1 * (b - 1)) * MS for b in SIZES] for _ in range(2)])


def run_join(join: str, arrival_ms: float, enc_steps: int) -> list[Request]:
    """Request 0 (1 encoder step, 10 decoder steps) alone from 0; request 1 (10 decoder steps) arrives later."""
    reqs = [Request(0, 0.0, sla=1.0, enc_steps=1, dec_steps=10),
            Request(1, arrival_ms * MS, sla=1.0, enc_steps=enc_steps, dec_steps=10)]
    policy = parse_policy(f"eager:dec_timesteps=10,join={join}").build(max_batch_size=8)
    Simulation(encoder_decoder_table(), policy).run(reqs)
    return reqs


def test_join_benefit_waits_where_a_long_encoder_would_stall_a_nearly_done_decode():
    """Request 1 arrives with 2 of request 0's steps left and 10 ms of encoder work. Joining stalls request 0 for
    those 10 ms to share 2 steps; waiting lets it end at 11 ms undisturbed. The summed latency is lower waiting."""
    always = run_join("always", 8.5, enc_steps=10)
    benefit = run_join("benefit", 8.5, enc_steps=10)
    assert always[1].start < always[0].finish  # joined: request 0 waited for its encoder
    assert benefit[0].finish / MS == pytest.approx(11.0)
    assert benefit[1].start >= benefit[0].finish
    assert sum(r.latency for r in benefit) < sum(r.latency for r in always)


def test_join_benefit_joins_where_sharing_the_steps_pays():
    """Request 1 arrives as request 0 starts decoding, with one encoder step: it joins (the steps of two cost 1.1x
    those of one), as under join=always."""
    benefit = run_join("benefit", 1.5, enc_steps=1)
    always = run_join("always", 1.5, enc_steps=1)
    assert benefit[1].start < benefit[0].finish
    assert [r.finish for r in benefit] == pytest.approx([r.finish for r in always])


def test_join_is_a_policy_parameter_with_a_clear_error():
    assert parse_policy("eager:join=benefit").build(max_batch_size=4).join == "benefit"
    assert parse_policy("eager").build(max_batch_size=4).join == "always"
    with pytest.raises(ConfigError, match="join must be one of always, benefit"):
        parse_policy("eager:join=later").build(max_batch_size=4)


def test_conditional_mean_is_the_mean_beyond_progress():
    h = LengthHistogram([2, 4, 10], [1.0, 1.0, 2.0])
    assert h.conditional_mean(0) == pytest.approx(6.5)
    assert h.conditional_mean(3) == pytest.approx(8.0)
    assert h.conditional_mean(10) == 11.0
