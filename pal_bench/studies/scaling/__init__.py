"""Throughput of data collection f_a(x) and data consumption f_l(x) against thread (or process) counts.

- ``measure_fa(cfg, x, steps)``: transitions/s into the buffer with x actor threads and no
  learning (``learning_starts`` is set past the budget, so learners never start);
- ``measure_fl(cfg, x, updates)``: learner updates/s (sample + loss + gradients + parameter
  server + priority update) with x learner threads on a buffer pre-filled with real environment
  transitions, and no actors.

Both run the real trainer's worker loops and parameter server. ``python -m pal_bench.studies.scaling``
measures x = 1..M (M = usable cores by default; ``--max-threads`` may go past it, and those rows
are marked ``oversubscribed``), writes ``results/scaling.csv`` and draws ``results/figures/scaling.png``
(throughput vs threads with f_a and f_l on one plot, speedup with the ideal line, parallel
efficiency).

``--backend ray`` measures the same curves with the Ray backend (``pal_bench.train.backends.ray``):
x actor processes (``RayTrainer`` with learning held off), and x learner processes on a buffer
actor pre-filled with real transitions (the backend's own buffer, parameter-server and learner
actors, no actor processes). It writes ``results/scaling_ray.csv`` (``--end-to-end``:
``results/end_to_end_ray.csv``, sync, async and allreduce aggregation); with both CSVs present
``results/figures/scaling_backends.png`` draws the two backends on one figure (``draw_backends``),
so that the GIL's effect (threads) and Ray's per-call overhead (processes) show side by side.
One local Ray session serves the whole sweep (started once, not per point). ``cores_used`` is
the driver's CPU time / wall time for threads; for Ray it is left empty (the work is in other
processes).

Modules: ``measure`` (the measurements and the command), ``figures`` (the drawings), ``publish`` (the tables of
docs/scaling.md and docs/backends.md, and the figures redrawn from the stored CSVs).
"""
