"""One module per question, each a ``pal-bench`` subcommand or ``python -m`` entry point: ``scaling`` (actor
and learner throughput against cores), ``dse`` (the core split), ``concurrency``, ``fanout``,
``shared_buffer``, ``plugin`` (drop-ins inside RLlib and tianshou), ``race`` (time to a target return),
``aggregation`` (gradient aggregation schemes) and ``longhaul`` (replay across a long-haul link)."""
