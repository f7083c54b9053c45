"""The CPU share's rank rule (batcher/cpu_rank.py): deadline-monotonic after the declared role, equal ranks left
equal, one nice step per distinct rank above."""

from __future__ import annotations

import pytest

from lazybatch.batcher.cpu_rank import BEST_EFFORT, LATENCY_CRITICAL, NICE_STEPS, ShareMember, cores_for, nice_for


def test_the_shorter_sla_ranks_first_and_equal_slas_stay_equal():
    small, large = ShareMember("small", 10.0), ShareMember("large", 100.0)
    assert nice_for(large, [small]) == NICE_STEPS[1] > 0
    assert nice_for(small, [large]) == 0
    assert nice_for(ShareMember("twin", 10.0), [small]) == 0  # equal rank: nobody yields
    assert nice_for(large, []) == 0  # nobody active: nothing to yield to
    assert nice_for(ShareMember("none"), [large]) == NICE_STEPS[1]  # no SLA ranks after every SLA


def test_a_declared_role_comes_before_the_sla():
    loose_but_critical = ShareMember("a", 1000.0, LATENCY_CRITICAL)
    tight_but_best_effort = ShareMember("b", 1.0, BEST_EFFORT)
    assert nice_for(ShareMember("c", 5.0), [loose_but_critical]) > 0
    assert nice_for(tight_but_best_effort, [ShareMember("d", 5000.0)]) > 0
    assert nice_for(loose_but_critical, [tight_but_best_effort, ShareMember("d", 1.0)]) == 0


def test_each_distinct_rank_above_is_one_step_and_the_steps_stop_at_the_last():
    me = ShareMember("me", 300.0)
    above = [ShareMember("a", 10.0), ShareMember("a2", 10.0), ShareMember("b", 100.0), ShareMember("c", 200.0)]
    assert nice_for(me, above[:2]) == NICE_STEPS[1]  # two members of one rank: one step
    assert nice_for(me, above[:3]) == NICE_STEPS[2]
    assert nice_for(me, above) == NICE_STEPS[-1] == 19


def test_an_unknown_role_is_refused():
    with pytest.raises(ValueError, match="role must be one of"):
        ShareMember("x", 1.0, "urgent")


def test_the_cores_split_between_the_most_urgent_active_rank_and_the_rest():
    small, mid, large = ShareMember("small", 10.0), ShareMember("mid", 50.0), ShareMember("large", 100.0)
    cores = (3, 0, 2, 1)
    assert cores_for(small, [large], cores) == (0, 1)  # the most urgent: the first half
    assert cores_for(large, [small], cores) == (2, 3)  # below it: the rest
    assert cores_for(mid, [small, large], cores) == (2, 3)  # every member below the most urgent shares the rest
    assert cores_for(small, [], cores) is None  # alone: every core
    assert cores_for(small, [ShareMember("twin", 10.0)], cores) is None  # equals: nothing to split
    assert cores_for(large, [small], (0,)) is None  # one core: nothing to split
    assert cores_for(small, [large], (0, 1, 2)) == (0,) and cores_for(large, [small], (0, 1, 2)) == (1, 2)


def test_a_member_that_does_not_split_takes_and_leaves_no_part():
    small, large = ShareMember("small", 10.0), ShareMember("large", 100.0)
    unsplit_large = ShareMember("large", 100.0, split=False)
    assert cores_for(small, [unsplit_large], (0, 1)) is None
    assert cores_for(unsplit_large, [small], (0, 1)) is None
    assert cores_for(large, [ShareMember("small", 10.0, split=False)], (0, 1)) is None
