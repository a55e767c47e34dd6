"""The trainer simulated (a discrete-event model, ``model.py``) from inputs measured on this machine
(``inputs.py``), fitted on the one-worker points (``calibrate.py``), checked against every stored point
(``validate.py``) and used to predict past the cores we have (``predict.py``); ``pal-bench simulate``
(``cli.py``); tables and figures in docs/simulation.md (``publish.py``, ``figures.py``)."""
