"""Environments that misbehave on purpose, for the trainer's failure tests. Registered on import, so that a
spawned actor or learner process finds them through gymnasium's ``"module:env_id"`` form, e.g.
``faulty_envs:PalTest/NaNRewardCartPole-v0`` (with this directory on ``PYTHONPATH`` / ``sys.path``)."""

import gymnasium as gym


class NaNRewardCartPole(gym.Wrapper):
    """CartPole whose rewards are NaN from each instance's 150th step on: the losses of any learner sampling
    those transitions turn NaN."""

    def __init__(self, env):
        super().__init__(env)
        self.t = 0

    def step(self, action):
        obs, rew, term, trunc, info = super().step(action)
        self.t += 1
        return obs, (float("nan") if self.t >= 150 else rew), term, trunc, info


class InfRewardCartPole(NaNRewardCartPole):
    """CartPole whose rewards from each instance's 150th step on overflow float32 (1e39, stored as inf)."""

    def step(self, action):
        obs, rew, term, trunc, info = super().step(action)
        return obs, (1e39 if rew != rew else rew), term, trunc, info


class CrashingCartPole(gym.Wrapper):
    """CartPole whose instances raise at their 40th step: every actor process using it dies soon after it
    starts stepping, incarnation after incarnation."""

    def __init__(self, env):
        super().__init__(env)
        self.t = 0

    def step(self, action):
        self.t += 1
        if self.t >= 40:
            raise RuntimeError("environment crashed on purpose")
        return super().step(action)


for _id, _cls in (("PalTest/NaNRewardCartPole-v0", NaNRewardCartPole),
                  ("PalTest/InfRewardCartPole-v0", InfRewardCartPole),
                  ("PalTest/CrashingCartPole-v0", CrashingCartPole)):
    if _id not in gym.registry:
        gym.register(_id, entry_point=lambda _c=_cls, **kw: _c(gym.make("CartPole-v1", **kw)))
