"""PAL's drop-in buffers inside RLlib and tianshou (``pal-bench plugin-bench``): ``measure`` times training
iterations with each framework's own buffer and with PAL's, ``profile`` shows where one iteration goes
(``python -m pal_bench.studies.plugin.profile``), ``publish`` holds the table and figure."""
