"""The rate rule every backend shares (pal_bench.train.rate_policy): pure functions of counters."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from pal_bench.train.config import TrainConfig
from pal_bench.train.rate_policy import RatePolicy, default_slack

RATIOS = st.sampled_from([0.05, 0.25, 0.5, 1.0, 2.0, 4.0])


@settings(max_examples=200, deadline=None)
@given(RATIOS, st.integers(0, 500), st.integers(1, 5000), st.integers(0, 6000))
def test_updates_allowed_by_steps_match_required_updates(ratio, starts, extra, steps):
    """With ``steps`` inserted, exactly ``required_updates(steps)`` updates may start, never more than the budget."""
    p = RatePolicy(ratio, starts, starts + extra, slack=10)
    allowed = 0
    while allowed < p.max_updates + 2 and p.learner_may_start(steps, allowed):
        allowed += 1
    assert allowed == min(p.required_updates(steps), p.max_updates + 2)
    assert p.max_updates == p.required_updates(starts + extra)


@given(RATIOS, st.integers(0, 500), st.integers(0, 100), st.integers(0, 1000))
def test_actors_run_ahead_by_the_slack_only(ratio, starts, slack, started):
    p = RatePolicy(ratio, starts, 10**6, slack)
    limit = starts + started / ratio + slack
    assert p.actor_may_step(int(limit) - 1, started) if limit >= 1 else True
    assert not p.actor_may_step(int(limit) + 1, started)
    # a learner finishing more updates only ever lets actors go further
    assert p.actor_may_step(int(limit) - 1, started + 1) if limit >= 1 else True


def test_default_slack_covers_learners_actors_and_chunks():
    cfg = TrainConfig(actors=3, learners=2, envs_per_actor=4, updates_per_step=0.25)
    assert default_slack(cfg) == max(16, 48)
    assert default_slack(cfg, chunk=100) == 600
    assert default_slack(TrainConfig(rate_slack=7)) == 7


@settings(max_examples=200, deadline=None)
@given(RATIOS, st.integers(1, 3), st.integers(1, 4), st.integers(2, 80), st.integers(1, 3), st.integers(0, 2**32))
def test_local_buffers_never_stall_actors_and_learners(ratio, actors, envs, local, learners, seed):
    """Actors that hold up to ``local_buffer`` env steps before inserting (counted as inserted only once sent) and
    learners that wait for inserted steps: with the default slack one side can always move until the budget is
    spent, whatever the interleaving (a smaller slack could leave both waiting)."""
    cfg = TrainConfig(actors=actors, envs_per_actor=envs, learners=learners, updates_per_step=ratio,
                      local_buffer=local, learning_starts=50, steps=1500)
    rnd = random.Random(seed)
    p = RatePolicy.from_config(cfg, default_slack(cfg))
    reserved, held, steps, started = 0, [0] * actors, 0, 0
    while not p.budget_spent(reserved):
        moves = ["learn"] if p.learner_may_start(steps, started) and not p.updates_exhausted(started) else []
        if p.actor_may_step(reserved, started):
            moves += [a for a in range(actors)]
        assert moves, f"stalled: reserved {reserved}, held {held}, inserted {steps}, updates {started}"
        move = rnd.choice(moves)
        if move == "learn":
            started += 1
            continue
        reserved += envs
        held[move] += envs
        if held[move] >= local:
            steps, held[move] = steps + held[move], 0


def test_default_slack_covers_a_local_buffer():
    cfg = TrainConfig(actors=2, envs_per_actor=3, updates_per_step=0.25, local_buffer=50)
    assert default_slack(cfg) == 2 * (50 + 3) + 4
