"""Shared-memory weight publication: readers never see a half-written version, nothing is left in /dev/shm."""

import multiprocessing as mp
import os
import time

import pytest
import torch

from pal_bench.train.shared_weights import SharedWeights, spec_of


def _shm_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("pal_w_")}


def _state(value: float) -> dict[str, torch.Tensor]:
    """Three tensors (a few hundred kB in all, so a copy takes long enough to be caught half-way), every
    element equal to ``value``."""
    return {"w1": torch.full((256, 128), value), "b1": torch.full((128,), value), "w2": torch.full((128, 300), value)}


def _reader(name, spec, reads, q):
    try:
        w = SharedWeights.attach(name, spec)
        out = {k: torch.empty(s) for k, s, _ in spec}
        seen, torn, last = 0, 0, 0
        while seen < reads:
            got = w.read(out, min_version=last + 1)
            if got is None:
                continue
            version, t = got
            values = torch.cat([x.flatten() for x in t.values()])
            # every element of every tensor holds the version's own value, and versions only grow
            if not (values == float(version)).all() or version <= last:
                torn += 1
            last = version
            seen += 1
        w.close()
        q.put(("ok", seen, torn))
    except BaseException as e:           # report, don't hang the parent
        q.put(("error", repr(e), 0))


def test_readers_in_other_processes_never_see_a_torn_version():
    before = _shm_names()
    spec = spec_of(_state(0.0))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with SharedWeights.create(spec) as w:
        readers = [ctx.Process(target=_reader, args=(w.name, spec, 1000, q)) for _ in range(2)]
        for p in readers:
            p.start()
        version, done = 0, 0
        results = []
        while done < len(readers) and version < 10**6:
            version = w.publish(_state(float(version + 1)))
            time.sleep(0.0002)        # a little slower than back to back, as a parameter server publishes
            while not q.empty():
                results.append(q.get())
                done += 1
        for p in readers:
            p.join(timeout=60)
        while len(results) < len(readers):
            results.append(q.get(timeout=10))
    assert all(r[0] == "ok" for r in results), results
    assert all(r[2] == 0 for r in results), f"torn reads: {results}"
    assert version > 1000
    assert _shm_names() == before


def test_version_starts_at_zero_and_read_waits_for_a_newer_one():
    spec = spec_of(_state(0.0))
    with SharedWeights.create(spec) as w:
        assert w.version == 0 and w.read() is None
        assert w.publish(_state(1.0)) == 1
        version, t = w.read()
        assert version == 1 and float(t["w1"][0, 0]) == 1.0
        assert w.read(min_version=2) is None


def test_load_into_a_module_only_when_newer():
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    spec = spec_of(net.state_dict())
    with SharedWeights.create(spec) as w:
        other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        assert w.load_into(other, 0) == 0                 # nothing published yet
        w.publish(net.state_dict())
        assert w.load_into(other, 0) == 1
        for a, b in zip(net.parameters(), other.parameters()):
            assert torch.equal(a, b)
        assert w.load_into(other, 1) == 1


def test_read_into_a_subset_copies_only_those_tensors():
    """An actor without Ape-X priorities reads only the online weights, straight into its network's tensors."""
    spec = spec_of(_state(0.0))
    with SharedWeights.create(spec) as w:
        w.publish(_state(2.0))
        out = {"w1": torch.zeros(256, 128), "b1": torch.zeros(128)}
        version, got = w.read(out)
        assert version == 1 and got is out and set(got) == {"w1", "b1"}
        assert bool((out["w1"] == 2.0).all()) and bool((out["b1"] == 2.0).all())
        net = torch.nn.Linear(4, 3)
        into = net.state_dict()                          # detached views of the parameters
        with SharedWeights.create(spec_of(into)) as wn:
            wn.publish({k: torch.full_like(v, 5.0) for k, v in into.items()})
            wn.read(into)
        assert bool((net.weight == 5.0).all()) and bool((net.bias == 5.0).all())


def test_bad_input_is_rejected_and_close_unlinks():
    before = _shm_names()
    spec = spec_of(_state(0.0))
    w = SharedWeights.create(spec)
    with pytest.raises(KeyError):
        w.publish({"w1": torch.zeros(256, 128)})
    with pytest.raises(ValueError):
        w.publish({**_state(1.0), "b1": torch.zeros(7)})
    with pytest.raises(TypeError):
        w.publish({**_state(1.0), "b1": torch.zeros(128, dtype=torch.float64)})
    assert w.version == 0 and w.read() is None              # nothing half-published
    with pytest.raises(TypeError):
        spec_of({"c": torch.zeros(2, dtype=torch.complex64)})
    name = w.name
    w.close()
    w.close()
    with pytest.raises(ValueError):
        w.read()
    with pytest.raises(FileNotFoundError):
        SharedWeights.attach(name, spec)
    assert _shm_names() == before


def test_a_partial_publish_keeps_the_other_tensors_of_the_last_version():
    spec = spec_of(_state(0.0))
    with SharedWeights.create(spec) as w:
        w.publish(_state(1.0))
        assert w.publish({"w1": torch.full((256, 128), 3.0)}, partial=True) == 2
        version, got = w.read()
        assert version == 2 and bool((got["w1"] == 3.0).all())
        assert all(bool((got[k] == 1.0).all()) for k in got if k != "w1")
        with pytest.raises(KeyError):                                  # an unknown name, even partial
            w.publish({"nope": torch.zeros(3)}, partial=True)
        assert w.read()[0] == 2


def test_the_driver_copies_the_targets_only_when_the_server_changed_them():
    """The process backend's driver publishes a snapshot whose target dict is the one it last copied as online
    weights only; a new target dict (a target copy) goes in whole, and readers see the server's targets."""
    from types import SimpleNamespace

    from pal_bench.train.backends.processes import ProcessTrainer
    from pal_bench.train.backends.processes.shared import Publisher
    from pal_bench.train.backends.processes.shared import flat_state as _flat_state
    from pal_bench.train.param_server import Snapshot

    online = {"w": torch.zeros(4, 2), "b": torch.zeros(2)}
    target = {k: v.clone() for k, v in online.items()}
    first = Snapshot(0, online, target)
    with SharedWeights.create(spec_of(_flat_state(first))) as w:
        calls = []
        publish = w.publish
        w.publish = lambda sd, partial=False: calls.append((sorted(sd), partial)) or publish(sd, partial)
        driver = SimpleNamespace(ps=SimpleNamespace(snapshot=first), _publisher=Publisher(w))
        ProcessTrainer._publish(driver)
        driver.ps.snapshot = Snapshot(1, {k: v + 1 for k, v in online.items()}, target)       # targets unchanged
        ProcessTrainer._publish(driver)
        new_target = {k: v + 7 for k, v in online.items()}
        driver.ps.snapshot = Snapshot(2, {k: v + 2 for k, v in online.items()}, new_target)   # a target copy
        ProcessTrainer._publish(driver)
        ProcessTrainer._publish(driver)                                                        # same version
        assert [len(names) for names, _ in calls] == [4, 2, 4]
        assert [partial for _, partial in calls] == [False, True, False]
        version, got = w.read()
        assert version == 3 and bool((got["online.w"] == 2).all()) and bool((got["target.w"] == 7).all())
