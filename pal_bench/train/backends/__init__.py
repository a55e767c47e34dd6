"""Where a run's workers live: ``threads`` (one process; also the driver every backend extends),
``processes`` (actor processes on the shared-memory buffer) and ``ray`` (Ray actors). A backend only
places workers and moves data; what a run means is in ``train.core``, ``train.rate_policy``,
``train.replay_spec``, ``train.recorder`` and ``train.algos``."""
