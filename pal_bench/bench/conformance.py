"""Does a buffer do what a prioritized replay buffer must (Schaul et al. 2016), before anyone times it?

``check(cls)`` runs the properties below on a small buffer (capacity 64, ``alpha`` 0.6, rows of the fields
``FIELDS`` that each carry their own row number, so a sampled row can be traced to the row inserted), one result
per property, in this order:

- ``construct``: ``cls(64, FIELDS, alpha=0.6, seed=seed)`` (``cls(64, FIELDS, seed=seed)`` for a buffer that
  declares ``PRIORITIZED = False``) and 64 rows through ``add_batch``, 16 at a time (``done`` on every 16th row);
- ``shapes``: ``sample(32, 0.4)`` returns every field as [32, *shape] of the declared dtype, ``indices`` [32] of
  integers and ``weights`` [32] of finite floats;
- ``fields``: every sampled row is one inserted row (all its fields from the same row), still held (one of the
  last 64 inserted), and an index returns the same row until rows are inserted, before and after 96 more rows
  wrap the ring;
- ``len``: ``len(buf)`` is 64 once full (fewer is reported: a buffer that evicts whole episodes);
- ``sampling``: after ``update_priorities`` gives the held rows priorities 1.1**rank (1 to ~400), 25,600 draws
  follow ``priority ** alpha`` (chi-square, failed below p = 0.001; seeded, so a correct buffer passes and a uniform
  one fails every time); a declared-uniform buffer is tested against uniform draws;
- ``weights``: at beta 0.4 and 1.0, ``weights / (N P(i)) ** -beta`` is one constant within each batch (to 0.1%);
  which constant is reported, not failed: the largest weight in the buffer (Schaul et al.), the batch's largest
  weight, none, or another;
- ``new-rows``: the priority a new row gets, estimated from its draws against the known rows' (to ~3%): the
  largest priority seen passes, another rule is reported;
- ``update``: raising one row's priority 1,000-fold makes it most of the next draws, in proportion;
- ``bad-nan``, ``bad-negative``, ``bad-index`` (ids -1 and far past the last), ``bad-shape`` (a wrong-shaped
  column, priorities of the wrong length), each on a fresh full buffer: raising passes; accepting it with the
  buffer still sampling as before is reported; a buffer that then samples wrongly, or not at all, fails.

``pal-bench check-buffer`` (``pal_bench.studies.conformance``) runs this in a child process per buffer (``python
-m pal_bench.bench.conformance NAME SEED START FD``, one JSON line per property on a pipe of its own), so that a
buffer that crashes or hangs on bad input is reported as such.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from pal_bench.bench.protocol import is_prioritized

FIELDS = {"obs": ((4,), np.dtype(np.float32)), "act": ((), np.dtype(np.int64)), "rew": ((), np.dtype(np.float32)),
          "next_obs": ((4,), np.dtype(np.float32)), "done": ((), np.dtype(np.bool_))}
CAPACITY = 64
ALPHA = 0.6
EPISODE = 16          # rows per add_batch call and per episode (done on the last)
GROWTH = 1.1          # priority of the row of rank r among the held rows: GROWTH ** r
DRAWS = 400           # batches of 64 for the sampling test (25,600 draws)
P_FAIL = 1e-3         # chi-square p-value below which sampling fails
WEIGHT_TOL = 1e-3     # relative spread of weights / (N P)^-beta allowed within a batch
PROPERTIES = ("construct", "shapes", "fields", "len", "sampling", "weights", "new-rows", "update", "bad-nan",
              "bad-negative", "bad-index", "bad-shape")
STATUSES = ("pass", "FAIL", "note", "skip")
MAX_DETAIL = 2000     # characters of a result's detail (a buffer's error message can be any length)


@dataclass
class Result:
    property: str
    status: str         # pass, FAIL, note (reported, not failed), skip
    detail: str


class Failed(Exception):
    """A property does not hold: the message says how."""


def _obs(ids: np.ndarray) -> np.ndarray:
    return np.stack([ids, -ids, 2 * ids, ids % 7], axis=1).astype(np.float32)


def rows(ids) -> dict[str, np.ndarray]:
    """The rows numbered ``ids``: every field is a function of the row's number. They form episodes of ``EPISODE``
    steps, as an environment makes them: a row's next observation is the following row's observation, except at
    an episode's end (``done``), where it is a terminal observation of its own; so buffers that store each
    observation once (RLlib's episodes, next-by-reference modes) hold them too."""
    ids = np.asarray(ids, dtype=np.int64)
    done = ids % EPISODE == EPISODE - 1
    next_obs = np.where(done[:, None], _obs(ids) + 0.25, _obs(ids + 1))
    return {"obs": _obs(ids), "act": ids.copy(), "rew": (ids * 0.5).astype(np.float32), "next_obs": next_obs,
            "done": done}


def row_numbers(out: dict, n: int) -> np.ndarray:
    """The row number of each of ``n`` sampled rows (from ``act``), after checking that all their fields are
    that row's (Failed otherwise)."""
    try:
        got = {k: np.asarray(out[k]).reshape(n, *shape) for k, (shape, _) in FIELDS.items()}
    except (KeyError, ValueError) as e:
        raise Failed(f"sample's output cannot be read as the declared fields: {e}") from None
    ids = got["act"].astype(np.int64)
    want = rows(ids)
    for k in FIELDS:
        bad = ~np.all((got[k] == want[k]).reshape(n, -1), axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise Failed(f"sampled row {i} has act {ids[i]} but its {k} is {got[k][i].tolist()}, row {ids[i]}'s is "
                         f"{want[k][i].tolist()}: its fields come from different rows or were changed")
    return ids


class Checker:
    """The properties of one buffer class, in order; ``emit`` gets each ``Result`` as it is known and ``start``
    the name of each property before it runs (so that a crash or hang can be pinned on one)."""

    def __init__(self, cls: type, seed: int = 0, emit: Callable[[Result], None] = print,
                 start: Callable[[str], None] = lambda _: None):
        self.cls, self.seed, self.emit, self.start = cls, seed, emit, start
        self.prioritized = is_prioritized(cls)
        self.buf = None
        self.inserted = 0
        self.prio: dict[int, float] = {}        # row number -> raw priority given
        self.index: dict[int, object] = {}      # row number -> its index (as sample returned it)

    # ---- helpers
    def make(self):
        random.seed(self.seed)
        np.random.seed(self.seed)
        kw = {"alpha": ALPHA} if self.prioritized else {}
        return self.cls(CAPACITY, dict(FIELDS), seed=self.seed, **kw)

    def insert(self, buf, n: int) -> None:
        for start in range(self.inserted, self.inserted + n, EPISODE):
            buf.add_batch(**rows(np.arange(start, min(start + EPISODE, self.inserted + n))))
        self.inserted += n

    def held(self) -> range:
        return range(max(0, self.inserted - CAPACITY), self.inserted)

    def draw(self, buf, batch: int, beta: float = 0.4) -> tuple[np.ndarray, list, np.ndarray]:
        out = buf.sample(batch, beta)
        ids = row_numbers(out, batch)
        held = self.held()
        old = [int(i) for i in ids if i not in held]
        if old:
            raise Failed(f"sampled row {old[0]}, which is not held (the last {CAPACITY} inserted are "
                         f"{held.start}..{held.stop - 1})")
        indices = list(np.asarray(out["indices"]).reshape(batch).tolist())
        return ids, indices, np.asarray(out["weights"], dtype=np.float64).reshape(batch)

    def draws(self, buf, batches: int, batch: int = CAPACITY, beta: float = 0.4) -> np.ndarray:
        return np.concatenate([self.draw(buf, batch, beta)[0] for _ in range(batches)])

    def discover(self, buf) -> None:
        """Sample until every held row's index is known (rows not drawn in 40 batches in a row are taken as gone)."""
        self.index.clear()
        quiet = 0
        for _ in range(600):
            ids, indices, _ = self.draw(buf, 32)
            known = len(self.index)
            for i, x in zip(ids.tolist(), indices):
                if self.index.setdefault(i, x) != x:
                    raise Failed(f"row {i} came back under index {x}, earlier under {self.index[i]}, with no insert "
                                 "between")
            quiet = 0 if len(self.index) > known else quiet + 1
            if len(self.index) == len(self.held()) or quiet >= 40:
                return

    def set_priorities(self, buf, prio: dict[int, float]) -> None:
        ids = list(prio)
        buf.update_priorities(np.asarray([self.index[i] for i in ids]), np.asarray([prio[i] for i in ids]))
        self.prio.update(prio)

    def expected(self, ids) -> np.ndarray:
        """P(i) of ``ids`` among the held, discovered rows (priority ** alpha, or uniform)."""
        live = sorted(self.index)
        if not self.prioritized:
            return np.full(len(ids), 1.0 / len(live))
        total = sum(self.prio[i] ** ALPHA for i in live)
        return np.array([self.prio[i] ** ALPHA / total for i in ids])

    # ---- the properties
    def run(self, start_at: str | None = None) -> None:
        """Every property in order; from ``start_at`` on (one of the ``bad-`` ones, which start from a fresh
        buffer) after a silent ``construct``, when the parent restarts a child that died."""
        steps = [("construct", self.construct), ("shapes", self.shapes), ("fields", self.fields), ("len", self.length),
                 ("sampling", self.sampling), ("weights", self.weights), ("new-rows", self.new_rows),
                 ("update", self.update), ("bad-nan", self.bad_nan), ("bad-negative", self.bad_negative),
                 ("bad-index", self.bad_index), ("bad-shape", self.bad_shape)]
        if start_at is not None:
            self.construct()
            steps = steps[[n for n, _ in steps].index(start_at):]
        for name, step in steps:
            self.start(name)
            if self.buf is None and name != "construct":
                self.emit(Result(name, "skip", "no buffer (construct failed)"))
                continue
            try:
                status, detail = step()
            except Failed as e:
                status, detail = "FAIL", str(e)
            except Exception as e:        # noqa: BLE001 - a buffer's own error is a finding, reported on its line
                status, detail = "FAIL", f"raised {type(e).__name__}: {e}"
            self.emit(Result(name, status, detail))

    def construct(self):
        buf = self.make()
        self.insert(buf, CAPACITY)
        self.buf = buf
        kind = "prioritized" if self.prioritized else "uniform (declared PRIORITIZED = False)"
        return "pass", f"{kind}; {CAPACITY} rows inserted with add_batch"

    def shapes(self):
        out = self.buf.sample(32, 0.4)
        problems = []
        for k, (shape, dtype) in FIELDS.items():
            if k not in out:
                problems.append(f"no {k}")
                continue
            a = np.asarray(out[k])
            if a.shape != (32, *shape) or a.dtype != dtype:
                problems.append(f"{k} {a.dtype}{list(a.shape)} (declared {dtype}{[32, *shape]})")
        for k, kinds in (("indices", "iu"), ("weights", "f")):
            a = np.asarray(out.get(k, []))
            if k not in out or a.shape != (32,) or a.dtype.kind not in kinds:
                problems.append(f"{k} {a.dtype}{list(a.shape)} (want {'integers' if kinds == 'iu' else 'floats'} [32])")
        w = np.asarray(out.get("weights", [0.0]), dtype=np.float64)
        if not np.all(np.isfinite(w)):
            problems.append("weights not finite")
        if problems:
            raise Failed("; ".join(problems))
        return "pass", "every field [B, *shape] of its declared dtype; indices and weights [B]"

    def fields(self):
        def consistent(batches: int) -> None:
            seen: dict = {}
            for _ in range(batches):
                ids, indices, _ = self.draw(self.buf, 32)
                for i, x in zip(ids.tolist(), indices):
                    if seen.setdefault(_key(x), i) != i:
                        raise Failed(f"index {x} returned row {seen[_key(x)]}, then row {i}, with no insert between")
        consistent(50)
        self.insert(self.buf, CAPACITY + CAPACITY // 2)     # the ring wraps
        consistent(100)
        return "pass", (f"every sampled row was inserted whole and is held; an index keeps its row; after wrap-around "
                        f"({self.inserted} rows into {CAPACITY}) too")

    def length(self):
        n = len(self.buf)
        if n == CAPACITY:
            return "pass", f"len = {n} when full"
        if 0 < n < CAPACITY:
            return "note", f"len = {n} of {CAPACITY} when full (it evicts more than one row at a time)"
        raise Failed(f"len = {n} after {self.inserted} rows into capacity {CAPACITY}")

    def sampling(self):
        self.discover(self.buf)
        live = sorted(self.index)
        if self.prioritized:
            self.set_priorities(self.buf, {i: GROWTH ** r for r, i in enumerate(live)})
        ids = self.draws(self.buf, DRAWS)
        counts = np.array([np.sum(ids == i) for i in live])
        exp = self.expected(live) * len(ids)
        chi2 = float(((counts - exp) ** 2 / exp).sum())
        p = float(stats.chi2.sf(chi2, len(live) - 1))
        uni = len(ids) / len(live)
        chi2_u = float(((counts - uni) ** 2 / uni).sum())
        what = "priority ** alpha" if self.prioritized else "uniform (as declared)"
        detail = f"{len(ids):,} draws over {len(live)} rows: chi-square {chi2:.1f} on {len(live) - 1} dof, p = {p:.3g}"
        if p < P_FAIL:
            closer = f" (closer to uniform draws: chi-square {chi2_u:.1f})" if chi2_u < chi2 else ""
            raise Failed(f"draws do not follow {what}: {detail}{closer}")
        return "pass", f"draws follow {what}: {detail}"

    def known(self) -> list[int]:
        """The held rows whose index is known (Failed when sampling never gave one)."""
        if not self.index:
            raise Failed("no row's index is known: sampling failed before any was drawn")
        return sorted(self.index)

    def weights(self):
        live = self.known()
        n = len(live)
        p_all = self.expected(live)
        norms: set[str] | None = None
        spread = 0.0
        consts: list[float] = []
        for beta in (0.4, 1.0):
            u_max = (n * p_all.min()) ** -beta
            for _ in range(20):
                ids, _, w = self.draw(self.buf, 32, beta)
                u = (n * self.expected(ids)) ** -beta
                r = w / u
                s = float(r.max() / r.min() - 1) if r.min() > 0 else float("inf")
                spread = max(spread, s)
                if not (s <= WEIGHT_TOL):
                    raise Failed(f"weights are not (N P(i))^-beta up to a constant at beta {beta}: "
                                 f"weights / (N P(i))^-beta spans {s:.2%} within one batch" + (
                                     " (the weights ignore beta?)" if beta == 1.0 else ""))
                c = float(np.median(r))
                consts.append(c)
                found = {"buffer": abs(c * u_max - 1) <= WEIGHT_TOL, "batch": abs(w.max() - 1) <= WEIGHT_TOL,
                         "none": abs(c - 1) <= WEIGHT_TOL}
                norms = {k for k, v in found.items() if v} if norms is None else norms & {k for k, v in found.items()
                                                                                          if v}
        # the normalisation that held in every batch (a batch holding the rarest row has both buffer and batch)
        norms = norms or {"other"}
        names = {"buffer": "divided by the largest weight in the buffer, (N min P)^-beta (Schaul et al. 2016)",
                 "batch": "divided by the largest weight in the batch", "none": "not normalised",
                 "other": f"divided by another constant ({min(consts):.3g} to {max(consts):.3g})"}
        how = names[next(k for k in ("buffer", "batch", "none", "other") if k in norms)]
        if not self.prioritized:
            return "pass", (f"constant within a batch, as uniform draws need ({min(consts):.3g} to {max(consts):.3g} "
                            "times (N P(i))^-beta)")
        return "pass", f"(N P(i))^-beta at beta 0.4 and 1.0 (within {spread:.1e}); {how}"

    def new_rows(self):
        if not self.prioritized:
            return "skip", "uniform (declared): no priorities"
        self.known()
        top = max(self.prio.values())
        new = self.inserted
        self.insert_one()
        ids = self.draws(self.buf, 300)
        known = [i for i in self.index if i in self.held()]
        n_new = int(np.sum(ids == new))
        n_known = int(np.isin(ids, known).sum())
        if n_new == 0 or n_known == 0:
            raise Failed(f"the new row was drawn {n_new} times in {len(ids):,} draws")
        mass = sum(self.prio[i] ** ALPHA for i in known if np.any(ids == i))
        est = (n_new * mass / n_known) ** (1 / ALPHA)
        self.prio[new] = est           # what update's expectations use for it
        if abs(est / top - 1) <= 0.1:
            return "pass", f"a new row gets the largest priority seen ({top:.1f}; estimated {est:.1f} from its draws)"
        return "note", f"a new row gets priority ~{est:.3g} (the largest seen is {top:.1f})"

    def insert_one(self) -> None:
        self.insert(self.buf, 1)

    def update(self):
        if not self.prioritized:
            return "skip", "uniform (declared): no priorities"
        self.discover(self.buf)
        live = self.known()
        for i in live:
            self.prio.setdefault(i, 1.0)
        x = min(live, key=lambda i: self.prio[i])
        before = self.expected([x])[0]
        self.set_priorities(self.buf, {x: 1000 * max(self.prio[i] for i in live)})
        want = float(self.expected([x])[0])
        ids = self.draws(self.buf, 50)
        got = float(np.mean(ids == x))
        if abs(got - want) > 0.05:
            raise Failed(f"after update_priorities raised row {x}'s priority, it was drawn {got:.1%} of the time "
                         f"(expected {want:.1%}, {before:.1%} before)")
        return "pass", (f"row {x}: {before:.1%} of draws before, {got:.1%} after raising its priority "
                        f"(expected {want:.1%})")

    # ---- bad input: each on a fresh buffer, then is it still sane?
    def fresh(self):
        self.inserted, self.prio = 0, {}
        buf = self.make()
        self.insert(buf, CAPACITY)
        self.discover(buf)
        return buf

    def sane(self, buf) -> str | None:
        """None when ``buf`` still samples its rows as before the bad input (uniformly: every row at the
        initial priority), else what is wrong."""
        try:
            ids = np.concatenate([self.draw(buf, CAPACITY)[0] for _ in range(30)])
            w = np.asarray(buf.sample(32, 0.4)["weights"], dtype=np.float64)
        except Failed as e:
            return str(e)
        except Exception as e:          # noqa: BLE001
            return f"sample then raised {type(e).__name__}: {e}"
        if not np.all(np.isfinite(w)):
            return "weights are then not finite"
        live = sorted(self.index)
        counts = np.array([np.sum(ids == i) for i in live])
        exp = len(ids) / len(live)
        p = float(stats.chi2.sf(float(((counts - exp) ** 2 / exp).sum()), len(live) - 1))
        if p < 1e-4:
            worst = live[int(np.argmax(np.abs(counts - exp)))]
            n = int(counts[live.index(worst)])
            return f"sampling then changed (row {worst} drawn {n} times, ~{exp:.0f} expected)"
        return None

    def probe(self, what: str, call: Callable[[object], object]) -> tuple[str, str]:
        buf = self.fresh()
        try:
            call(buf)
        except Exception as e:          # noqa: BLE001 - raising is the wanted answer
            why = self.sane(buf)
            if why:
                raise Failed(f"{what}: raised {type(e).__name__} but {why}") from None
            return "pass", f"{what}: raises {type(e).__name__}"
        why = self.sane(buf)
        if why:
            raise Failed(f"{what}: accepted, and {why}")
        return "note", f"{what}: accepted without an error; sampling unchanged after it"

    def _first(self) -> object:
        return self.index[min(self.index)]

    def bad_nan(self):
        if not self.prioritized:
            return "skip", "uniform (declared): no priorities"
        return self.probe("priority NaN", lambda b: b.update_priorities(np.asarray([self._first()]),
                                                                         np.array([np.nan])))

    def bad_negative(self):
        if not self.prioritized:
            return "skip", "uniform (declared): no priorities"
        return self.probe("priority -5", lambda b: b.update_priorities(np.asarray([self._first()]), np.array([-5.0])))

    def bad_index(self):
        if not self.prioritized:
            return "skip", "uniform (declared): no priorities"
        results = []
        for bad in (-1, 10**6):
            results.append(self.probe(f"index {bad}", lambda b, bad=bad: b.update_priorities(
                np.asarray([bad]), np.array([1.0]))))
        return _worst(results)

    def bad_shape(self):
        wrong = rows(np.arange(10**6, 10**6 + 4))
        wrong["obs"] = np.zeros((4, 5), np.float32)
        results = [self.probe("obs of shape [4, 5] for [4]", lambda b: b.add_batch(**wrong))]
        if self.prioritized:
            results.append(self.probe("3 indices with 2 priorities", lambda b: b.update_priorities(
                np.asarray([self.index[i] for i in sorted(self.index)[:3]]), np.array([1.0, 2.0]))))
        return _worst(results)


def _worst(results: list[tuple[str, str]]) -> tuple[str, str]:
    order = {"pass": 0, "note": 1}
    status = max((s for s, _ in results), key=lambda s: order.get(s, 2))
    return status, "; ".join(d for _, d in results)


def _key(x) -> object:
    try:
        hash(x)
        return x
    except TypeError:
        return repr(x)


def check(cls: type, seed: int = 0) -> list[Result]:
    """Every property of ``cls`` in this process (``pal-bench check-buffer`` runs it in a child instead)."""
    out: list[Result] = []
    Checker(cls, seed, out.append).run()
    return out


def main(argv: list[str] | None = None) -> int:
    """The child ``pal-bench check-buffer`` starts: ``python -m pal_bench.bench.conformance NAME SEED START FD``;
    one JSON line per property (``{"start": name}`` before each, a ``Result`` after, its detail cut to
    ``MAX_DETAIL`` characters) on file descriptor ``FD`` (stdout with ``-``), so that what the buffer prints cannot
    mix with them; ``START`` (a ``bad-`` property, or ``-`` for all) skips the properties before it; ``resolve``
    only loads NAME and says ``{"resolved": true}`` or ``{"resolved": "why not"}``."""
    from pal_bench.bench.adapters.registry import implementation_for_check
    from pal_bench.bench.protocol import BufferNameError

    argv = sys.argv[1:] if argv is None else argv
    name, seed, start_at, fd = (argv + ["0", "-", "-"][len(argv) - 1:])[:4]
    out = sys.stdout if fd == "-" else os.fdopen(int(fd), "w")

    def say(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        cls = implementation_for_check(name)
    except BufferNameError as e:
        if start_at == "resolve":
            say({"resolved": str(e)[:MAX_DETAIL]})
            return 0
        raise
    if start_at == "resolve":
        say({"resolved": True})
        return 0

    def emit(r: Result) -> None:
        say(asdict(r) | {"detail": r.detail[:MAX_DETAIL]})

    Checker(cls, int(seed), emit=emit, start=lambda p: say({"start": p})).run(None if start_at == "-" else start_at)
    return 0


if __name__ == "__main__":
    sys.exit(main())
