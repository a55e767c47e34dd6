"""Ape-X's parts: the dueling head, the per-actor exploration schedule and the ``apex`` preset."""

import pytest
import torch

from pal_bench.train import ConfigError, Trainer, make_config, validate
from pal_bench.train.core import RunCore
from pal_bench.train.nets import DuelingQ


def test_dueling_head_subtracts_the_mean_advantage():
    """Hand-worked: all weights zero, V's bias 2, A's biases (1, 3): Q = 2 + (1, 3) - 2 = (1, 3)."""
    net = DuelingQ(4, 2, (8, 8))
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.value[-1].bias.fill_(2.0)
        net.advantage[-1].bias.copy_(torch.tensor([1.0, 3.0]))
    q = net(torch.randn(5, 4))
    assert q.shape == (5, 2) and torch.allclose(q, torch.tensor([[1.0, 3.0]] * 5))


def test_dueling_q_mean_over_actions_is_the_value_stream():
    torch.manual_seed(0)
    for hidden in ((16,), (16, 16), (16, 8, 8)):
        net = DuelingQ(3, 5, hidden)
        x = torch.randn(7, 3)
        q = net(x)
        v = net.value(net.trunk_act(net.trunk(x))).squeeze(-1)
        assert q.shape == (7, 5) and torch.allclose(q.mean(-1), v, atol=1e-6)


def test_apex_epsilons_follow_horgan_et_al():
    """epsilon_i = 0.4^(1 + 7 i / (N - 1)): actor 0 at 0.4, the last at 0.4^8, decreasing between."""
    core = RunCore(make_config("dqn", "CartPole-v1", exploration="apex", actors=8))
    eps = [core.actor_epsilon(i) for i in range(8)]
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert eps[3] == pytest.approx(0.4 ** (1 + 7 * 3 / 7))
    assert all(a > b for a, b in zip(eps, eps[1:]))
    assert core.explore(0, 5) == core.explore(10**6, 5) == eps[5]      # fixed over the run
    assert RunCore(make_config("dqn", "CartPole-v1", exploration="apex", actors=1)).actor_epsilon(0) == 0.4
    decay = RunCore(make_config("dqn", "CartPole-v1"))
    assert decay.explore(0, 0) == decay.explore(0, 3) == 1.0


def test_apex_preset_and_its_errors():
    cfg = make_config(preset="apex", env="LunarLander-v3", actors=3)
    assert (cfg.algo, cfg.dueling, cfg.n_step, cfg.actor_priorities, cfg.exploration, cfg.learners, cfg.actors) == (
        "ddqn", True, 3, True, "apex", 1, 3)
    with pytest.raises(ConfigError, match="preset 'apex' trains ddqn, not sac"):
        make_config("sac", preset="apex")
    with pytest.raises(ConfigError, match="unknown preset 'r3d3'"):
        make_config(preset="r3d3")
    with pytest.raises(ConfigError, match="dueling is for the DQN family"):
        validate(make_config("sac", "Pendulum-v1", dueling=True))
    with pytest.raises(ConfigError, match="exploration must be"):
        validate(make_config("dqn", exploration="boltzmann"))


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_an_apex_run_reports_each_actors_epsilon(tmp_path, backend):
    cfg = make_config(preset="apex", env="CartPole-v1", actors=2, steps=800, learning_starts=500, batch_size=32,
                      hidden=(32, 32), eval_episodes=1, eval_interval=800, out_dir=str(tmp_path), progress=False,
                      backend=backend, deterministic=False if backend == "threads" else None)
    from pal_bench.train import make_trainer

    with make_trainer(cfg) as tr:
        s = tr.run()
    assert s["env_steps"] == 800 and s["updates"] > 0
    assert s["actor_epsilons"] == [pytest.approx(0.4), pytest.approx(0.4 ** 8)]
    assert isinstance(tr, Trainer)


def test_local_buffer_holds_steps_until_full_then_sends_them_in_one_insert():
    from types import SimpleNamespace

    import numpy as np

    from pal_bench.train.workers import LocalBuffer, PhaseTimer

    calls = []
    buffer = SimpleNamespace(add_batch=lambda priorities=None, **b: calls.append(b["x"].tolist()))
    stepper = SimpleNamespace(batch=lambda items: {"x": np.array(items)})
    local = LocalBuffer(SimpleNamespace(cfg=SimpleNamespace(local_buffer=5)), buffer, stepper, None, None,
                        PhaseTimer())
    assert local.put([1, 2], 2) == 0 and local.put([3], 2) == 0 and calls == []
    assert local.put([4, 5], 2) == 6 and calls == [[1, 2, 3, 4, 5]]          # 6 env steps held >= 5: sent
    assert local.put([6], 1, send=True) == 1 and calls[-1] == [6]           # the budget's end sends at once
    assert local.put([], 1) == 0 and local.send() == 1 and len(calls) == 2  # no items: nothing inserted


def test_local_buffer_config():
    cfg = make_config(preset="apex", env="LunarLander-v3", actors=1)
    assert cfg.local_buffer == 50 and not cfg.lockstep       # lockstep inserts every step: off by default
    with pytest.raises(ConfigError, match="local_buffer must be >= 1"):
        validate(make_config("dqn", local_buffer=0))
    with pytest.raises(ConfigError, match="local_buffer: lockstep runs"):
        validate(make_config("dqn", local_buffer=8, deterministic=True))
    with pytest.raises(ConfigError, match=r"rate_slack \(10\) must be >= 21"):
        validate(make_config("dqn", local_buffer=16, rate_slack=10, updates_per_step=0.25, actors=1))
    validate(make_config("dqn", local_buffer=16, rate_slack=21, updates_per_step=0.25, actors=1))
