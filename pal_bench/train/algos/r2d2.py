"""R2D2 (Kapturowski et al. 2019): recurrent replay with stored LSTM state, burn-in, value rescaling.

A replayed item is a sequence of T = ``seq_len`` steps with the LSTM state (h0, c0) the actor had at its
first step. The learner unrolls the online and the target network from that stored state; the first
``burn_in`` steps only refresh the state (no gradient, no loss), the loss is on the rest.

Value rescaling (Pohlen et al. 2018), eps = 1e-3, and its exact inverse:

    h(x)    = sign(x) (sqrt(|x| + 1) - 1) + eps x
    h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)

n-step double-Q target for a learning step t (k <= n steps taken: fewer when the episode ends first):

    y_t = h( sum_{j<k} gamma^j r_{t+j} + [not terminated] gamma^k h^-1( Q_target(s_{t+k}, a*) ) ),
    a*  = argmax_a Q_online(s_{t+k}, a)

    loss = mean_i w_i * (sum_t m_it (Q(s_t, a_t) - y_t)^2 / 2) / sum_t m_it      (m: the learning mask)
    priority_i = eta max_t |delta_t| + (1 - eta) mean_t |delta_t|               (over m_it = 1; eta = 0.9)

A step learns (m = 1) when it is a real transition (``mask``), lies at or after ``burn_in``, and its
target exists inside the sequence: the episode terminated within the n steps, or the step it bootstraps
from is in the sequence with an observation (``obs_valid``: real steps, and the final observation an
actor appends after a time-limit end). The last steps of a sequence that cannot bootstrap learn in the
next sequence, which overlaps this one by ``seq_overlap`` (> n) steps.

As an ``--algo`` (every backend): actors act with ``act`` and their per-environment LSTM state, cut their steps
with ``pal_bench.train.sequences.SequenceBuilder`` and insert whole sequences; the replay buffer holds sequences
(``buffer_capacity`` counts sequences, ``replay_spec``); learners sample B sequences and write back per-sequence
priorities; evaluation is greedy with the state carried through the episode.

Sequence fields (``torch`` tensors, B sequences): ``obs`` [B, T, obs_dim], ``act`` [B, T] int64, ``rew``
[B, T], ``done`` [B, T] (terminated after this step), ``mask`` [B, T], ``obs_valid`` [B, T], ``h0``/``c0``
[B, lstm], ``weights`` [B].
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pal_bench.sequence_replay import PRIORITY_ETA, sequence_priority
from pal_bench.train.algos.dqn import epsilon_greedy, update_targets  # the target network: DQN's hard copy

__all__ = ["PRIORITY_ETA", "RecurrentQ", "act", "h", "h_inv", "initial_state", "losses", "n_step_targets",
           "networks", "sequence_priority", "update_targets"]

VALUE_EPS = 1e-3

DEFAULT_ENV = "pal_bench/CartPoleNoVel-v0"
# the paper's sequence shape (80 steps overlapping by 40, burn-in 40, 5-step returns); B counts sequences
DEFAULTS = dict(lr=1e-3, batch_size=32, n_step=5, seq_len=80, seq_overlap=40, burn_in=40, lstm_size=64,
                hidden=(64,), target_update=250, updates_per_step=0.02, buffer_capacity=2_000, gamma=0.99,
                learning_starts=2_000)
# CartPoleNoVel: sequences a quarter of the paper's (20 steps, overlap 10, burn-in 5, 3-step returns), so that an
# update costs ~8 ms on one CPU core instead of ~25 ms, and more updates per step (0.1)
ENV_DEFAULTS = {
    "pal_bench/CartPoleNoVel-v0": dict(steps=30_000, seq_len=20, seq_overlap=10, burn_in=5, n_step=3,
                                       updates_per_step=0.1, target_update=200, buffer_capacity=5_000,
                                       eps_fraction=0.2, eval_interval=5_000),
}
CONTINUOUS = False
RECURRENT = True
GROUPS = {"q": ["q"]}
TARGETS = ["q"]


def h(x: torch.Tensor, eps: float = VALUE_EPS) -> torch.Tensor:
    """Invertible value rescaling: sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def h_inv(x: torch.Tensor, eps: float = VALUE_EPS) -> torch.Tensor:
    """The exact inverse of ``h``."""
    return torch.sign(x) * (((torch.sqrt(1 + 4 * eps * (x.abs() + 1 + eps)) - 1) / (2 * eps)) ** 2 - 1)


class RecurrentQ(nn.Module):
    """MLP torso -> LSTM -> dueling head: obs [B, T, obs_dim] with state ((1, B, H), (1, B, H)) ->
    Q [B, T, n_actions] and the state after the last step."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64, lstm: int = 64):
        super().__init__()
        self.torso = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU())
        self.lstm = nn.LSTM(hidden, lstm, batch_first=True)
        self.value = nn.Linear(lstm, 1)
        self.advantage = nn.Linear(lstm, n_actions)
        self.lstm_size = lstm

    def initial_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.zeros(1, batch, self.lstm_size)
        return z, z.clone()

    def forward(self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        out, state = self.lstm(self.torso(obs), state)
        return self._head(out), state

    def step(self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        """One step, the same numbers as ``forward`` on [B, 1]: obs [B, obs_dim] -> Q [B, n_actions] and the
        new state; one fused LSTM cell (about 5x cheaper than ``nn.LSTM`` on one step, what the actors do)."""
        h, c = torch.lstm_cell(self.torso(obs), (state[0][0], state[1][0]), self.lstm.weight_ih_l0,
                               self.lstm.weight_hh_l0, self.lstm.bias_ih_l0, self.lstm.bias_hh_l0)
        return self._head(h), (h.unsqueeze(0), c.unsqueeze(0))

    def _head(self, out: torch.Tensor) -> torch.Tensor:
        a = self.advantage(out)
        return self.value(out) + a - a.mean(dim=-1, keepdim=True)


def networks(obs_dim: int, action_space, cfg) -> nn.ModuleDict:
    """The online recurrent Q-network (torso width ``cfg.hidden[0]``, LSTM ``cfg.lstm_size``)."""
    return nn.ModuleDict({"q": RecurrentQ(obs_dim, int(action_space.n), int(cfg.hidden[0]), cfg.lstm_size)})


def initial_state(nets: nn.ModuleDict, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero LSTM state for ``batch`` environments: ((1, batch, H), (1, batch, H))."""
    return nets["q"].initial_state(batch)


def act(nets: nn.ModuleDict, obs: np.ndarray, explore: float, generator: np.random.Generator,
        state: tuple[torch.Tensor, torch.Tensor]) -> tuple[np.ndarray, tuple[torch.Tensor, torch.Tensor]]:
    """One step of E environments: observations [E, obs_dim] and their LSTM state -> epsilon-greedy actions
    int64[E] and the state after this step."""
    with torch.no_grad():
        q, state = nets["q"].step(torch.as_tensor(obs, dtype=torch.float32), state)
    return epsilon_greedy(q, explore, generator), state


def n_step_targets(rew: torch.Tensor, done: torch.Tensor, mask: torch.Tensor, obs_valid: torch.Tensor,
                   boot: torch.Tensor, gamma: float, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unrescaled n-step returns and which exist, for every step of [B, T] sequences.

    ``boot`` [B, T]: h^-1(Q_target(s_t, a*_t)), the value to bootstrap from at step t. Returns ``(G, ok)``:
    G_t = sum_{j<k} gamma^j r_{t+j} + [not terminated] gamma^k boot_{t+k}, and ok_t whether that target lies
    inside the sequence (see the module docstring)."""
    B, T = rew.shape
    G = torch.zeros(B, T, dtype=rew.dtype)
    ok = torch.zeros(B, T, dtype=torch.bool)
    open_ = mask.bool().clone()              # still accumulating: no termination, no end, fewer than n steps
    disc = torch.ones(B, T, dtype=rew.dtype)
    idx = torch.arange(T)
    for j in range(n):
        at = idx + j                          # the step whose reward is added now
        inside = at < T
        at_c = at.clamp(max=T - 1)
        r = rew[:, at_c] * inside
        real = mask[:, at_c].bool() & inside
        G = G + torch.where(open_ & real, disc * r, torch.zeros_like(G))
        term = open_ & real & done[:, at_c].bool()
        ok |= term                             # terminated within the window: no bootstrap needed
        open_ = open_ & real & ~done[:, at_c].bool()
        disc = disc * gamma
        nxt = at + 1                          # where the window goes next, or bootstraps from
        nxt_in = nxt < T
        nxt_c = nxt.clamp(max=T - 1)
        ends_here = open_ & (~nxt_in | ~mask[:, nxt_c].bool() | torch.tensor(j == n - 1))
        can_boot = ends_here & nxt_in & obs_valid[:, nxt_c].bool()
        G = G + torch.where(can_boot, disc * boot[:, nxt_c], torch.zeros_like(G))
        ok |= can_boot
        open_ = open_ & ~ends_here
    return G, ok


def losses(nets, targets, batch: dict, cfg, update: int):
    """Burn-in from the stored state, then the double-Q, value-rescaled n-step loss on the learning steps.
    Returns ``({"q": loss}, per-sequence priority)`` (float64[B] tensor, for ``update_priorities``)."""
    q_net, t_net = nets["q"], targets["q"]
    obs, burn = batch["obs"], cfg.burn_in
    state = (batch["h0"].unsqueeze(0), batch["c0"].unsqueeze(0))
    with torch.no_grad():
        _, online_state = q_net(obs[:, :burn], state) if burn else (None, state)
        q_target, _ = t_net(obs, state)                     # [B, T, A]
    q_learn, _ = q_net(obs[:, burn:], online_state)         # [B, T - burn, A]
    B, T = batch["rew"].shape
    q_online = torch.cat([torch.zeros(B, burn, q_learn.shape[-1]), q_learn.detach()], dim=1)
    a_star = q_online.argmax(-1, keepdim=True)
    boot = h_inv(q_target.gather(-1, a_star).squeeze(-1))
    G, ok = n_step_targets(batch["rew"], batch["done"], batch["mask"], batch["obs_valid"], boot, cfg.gamma,
                           cfg.n_step)
    y = h(G)[:, burn:]
    learn = (ok & batch["mask"].bool())[:, burn:]
    q_taken = q_learn.gather(-1, batch["act"][:, burn:].long().unsqueeze(-1)).squeeze(-1)
    delta = torch.where(learn, q_taken - y, torch.zeros_like(y))
    per_seq = (0.5 * delta ** 2).sum(1) / learn.sum(1).clamp(min=1)
    loss = (batch["weights"] * per_seq).mean()
    learn_np = learn.numpy()
    prio = sequence_priority(delta.detach().abs().numpy(), learn_np, getattr(cfg, "priority_eta", PRIORITY_ETA))
    return {"q": loss}, torch.from_numpy(prio)
