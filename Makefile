# PAL-Bench: two commands. `make test` runs the tests, `make bench` the quick benchmark sweep.
# Both create .venv when it is missing and install what they need into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is pinned: this exact version installs as a CPU build; a bare `torch` pulls a multi-GB CUDA build.
# pip compiles every installed module (not --no-compile): these machines set PYTHONDONTWRITEBYTECODE=1, so a module
# pip did not compile is compiled again by every process that imports it (a CI run with --no-compile was ~40% slower).
# For the same reason the project's own modules, installed editable (which pip does not compile), are compiled
# before the tests (COMPILE): every spawned actor, learner, Ray worker and CLI subprocess would compile them again.
# compileall skips what is current; a stale .pyc is never used (Python checks it against its source)
TORCH := torch==2.13.0
COMPILE := $(PY) -m compileall -q pal_bench tests suites

.PHONY: test bench bench-compare figures report lint install clean train-results scaling plugin-bench race

$(VENV)/.installed: pyproject.toml setup.py $(wildcard pyx/*.pyx pyx/*.pxd pal_bench/*.pxd)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)" "Cython==3.3.1" "numpy>=2" "setuptools>=68" wheel
	$(PIP) install -q --no-build-isolation -e ".[test,bench,peers,train]"
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(COMPILE)
	$(PY) -m pytest -q --durations=40 tests
	OMP_NUM_THREADS=1 $(PY) -m pal_bench.bench.regression

bench-compare: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) -m pal_bench.bench.run --compare

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check pal_bench tests suites
	$(VENV)/bin/lint-imports

# the studies, then the report: every table and figure rebuilt from what they stored. WORKLOAD=atari (or humanoid)
# runs the latency suites on that workload's rows instead, into results/workloads/<name>/ (docs/workloads.md)
WORKLOAD ?= lunarlander
bench: $(VENV)/.installed
ifeq ($(WORKLOAD),lunarlander)
	OMP_NUM_THREADS=1 $(PY) -m pal_bench.studies.fanout
	OMP_NUM_THREADS=1 $(PY) -m pal_bench.studies.shared_buffer
	OMP_NUM_THREADS=1 $(PY) -m pal_bench.bench.run
else
	OMP_NUM_THREADS=1 $(PY) -m pal_bench.bench.run --workload $(WORKLOAD)
endif
	$(PY) -m pal_bench.report

# the trainer's reference runs (about 1 h on 2 cores) and the scaling / core-split measurements
train-results: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) -m pal_bench.studies.training

scaling: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) -m pal_bench.studies.scaling --max-threads 4
	OMP_NUM_THREADS=1 $(PY) -m pal_bench.cli dse --curves results/scaling.csv --max-cores 4 --validate 20000 --out results

# PAL's drop-in buffers inside RLlib and tianshou (about 15 min) and the race to a target return
# (quick: the matched track on CartPole-v1, 3 seeds, about 15 min; `$(VENV)/bin/pal-bench race` alone is the
# full LunarLander race in resumable pieces, `--track tuned` the tuned track, `--speed` the speed rounds)
plugin-bench: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(VENV)/bin/pal-bench plugin-bench

race: $(VENV)/.installed
	$(VENV)/bin/pal-bench race --quick

# every table of README.md and docs/ and every figure, from the stored results alone (measures nothing): the
# built-in buffers' conformance checks (a minute; not timings), the simulation's validation and predictions are computed again from the stored inputs and points first (about
# 25 min on 2 cores; tests/test_simulate_current.py checks that the stored ones are what the model says today)
SIM_BACKENDS := threads,processes,learner-processes,learner-allreduce,ray-node,ray
figures: $(VENV)/.installed
	$(VENV)/bin/pal-bench check-buffer --builtin --out results/conformance.csv || [ $$? -eq 1 ]   # 1: a peer fails one
	$(VENV)/bin/pal-bench simulate --validate --samples 2
	$(VENV)/bin/pal-bench simulate --backend $(SIM_BACKENDS) --cores 1,2,3,4,6,8,12,16,24,32,48,64 --samples 5 --no-figure
	$(PY) -m pal_bench.report

# the same, plus one static page of everything: results/report/index.html
report: $(VENV)/.installed
	$(VENV)/bin/pal-bench report

clean:
	rm -rf build pal_bench/*.so pyx/*.c *.egg-info $(VENV)
