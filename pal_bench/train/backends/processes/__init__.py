"""The process backend: actor processes write straight into the shared-memory replay buffer.

Placement: every actor is an OS process (``spawn``) stepping its own environments with its own copy of
the policy; learners are threads of the driver, next to the parameter server (torch releases the GIL in
its kernels). What crosses a process boundary, and how:

- transitions: each actor calls ``add_batch`` on the driver's ``PrioritizedReplayBuffer(shared=True)``
  segment (attached by name): no pipe, no pickling;
- weights: the driver publishes every new parameter-server version into a ``SharedWeights`` block
  (seqlock); an actor copies it when its version counter moved;
- counters: one named control block (``pal_bench._segment.SharedControl``, attached by name): per actor,
  transitions reserved and inserted (one writer each), plus the learners' started updates, a pause flag and a
  stop flag written by the driver. An actor asks for its next vector step under the block's robust,
  process-shared lock (a holder that dies inside leaves it usable), with the rule of ``rate_policy.RatePolicy``;
- episodes, errors and per-phase timers: small messages on a queue.

Everything else (config, algorithms, learners, evaluation, checkpoints, logs, ``summary.json``) is the
thread trainer's. An actor process that dies (exception or SIGKILL) is restarted; the transitions it had
reserved but not inserted are given back to the budget and recorded in ``events.csv``. Actor processes
exit on the stop flag, on the end of the budget, and when the driver dies (``PR_SET_PDEATHSIG`` plus a
parent check), and ignore Ctrl-C, SIGTERM and SIGHUP (the driver handles them and stops them). An actor that dies
more than ``MAX_RESTARTS`` times ends the run with ``ActorGaveUp`` (one line) after a final checkpoint; a worker
process whose learner or actor-side priorities diverge sends that one line (``Diverged``) instead of a traceback.
"""

from pal_bench.train.backends.processes.trainer import ActorGaveUp, ProcessTrainer

__all__ = ["ActorGaveUp", "ProcessTrainer"]
