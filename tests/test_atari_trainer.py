"""The trainer on a real Atari game (issue 51): ale-py's Pong with gymnasium's Atari preprocessing and frame
stacking, the Ape-X preset with the Nature-DQN network, in an actor process; a short run that checkpoints and
resumes. No learning target: 2 CPUs cannot train Pong in CI time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from pal_bench.train import Trainer, make_config, make_trainer  # noqa: E402
from pal_bench.train.config import ConfigError  # noqa: E402
from pal_bench.train.nets import NatureQ  # noqa: E402

PONG = "ALE/Pong-v5"


def pong_cfg(tmp_path, steps):
    return make_config(None, PONG, preset="apex", backend="processes", actors=1, steps=steps, learning_starts=100,
                       buffer_capacity=1000, batch_size=16, eval_episodes=0, checkpoint_interval=150,
                       out_dir=str(tmp_path), name="pong", progress=False)


def test_pong_apex_runs_checkpoints_and_resumes(tmp_path):
    with make_trainer(pong_cfg(tmp_path, 300)) as tr:
        assert isinstance(tr.ps.nets["q"], NatureQ) and tr.ps.nets["q"].dueling
        assert tr.buffer.fields["obs"] == ((4, 84, 84), np.dtype(np.uint8))
        s = tr.run()
        assert s["env_steps"] == 300 and s["updates"] > 0
        obs = tr.buffer.sample(8)["obs"]
    assert obs.dtype == np.uint8 and obs.shape == (8, 4, 84, 84) and obs.max() > 0
    with make_trainer(pong_cfg(tmp_path, 400), resume=True) as tr:
        assert tr.rate.steps == 300 and len(tr.buffer) == 300
        s = tr.run()
    assert s["env_steps"] == 400


def test_nature_q_shapes_and_scaling():
    net = NatureQ((4, 84, 84), 6, dueling=False)
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    assert net(x).shape == (3, 6)
    torch.testing.assert_close(net(x), net(x.float()))       # uint8 and float frames read the same


def test_image_observations_need_the_dqn_family(tmp_path):
    with pytest.raises(ConfigError, match="convolutional"):
        Trainer(make_config("r2d2", PONG, out_dir=str(tmp_path)))
