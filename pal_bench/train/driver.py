"""The driver every backend shares (``Driver``): a run's config and seeds, its clock, counters and recorder,
evaluation, the summary, checkpoints and resuming; how a stop signal (Ctrl-C, SIGTERM, SIGHUP) reaches the run;
and the schedule of evaluations and checkpoints. A backend (``backends/``) places the parameter server, the
replay buffer and the rate counters and runs the workers.

At the end of a run the logs and ``summary.json`` are written before the final checkpoint, so that a checkpoint
that cannot be written (a full disk) still leaves them.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from pal_bench.train.config import Q_ALGOS, ConfigError, TrainConfig, validate
from pal_bench.train.core import RunCore
from pal_bench.train.recorder import RunFileError, RunRecorder, check_keys
from pal_bench.train.replay_spec import buffer_class, make_buffer

JOIN_TIMEOUT_S = 10.0      # how long the driver waits for its workers after a stop (s)


class WorkerError(RuntimeError):
    """A worker thread raised; the message holds its name and traceback."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP during ``run``: the same clean stop as Ctrl-C (final checkpoint, close); ``signum`` says
    which signal, for an exit status of 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_handling = threading.local()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While the block runs in the main thread, SIGTERM and SIGHUP raise ``Interrupted`` there (once: a second
    signal does not interrupt the stop it started); a signal ignored before (``nohup``) stays ignored, and the
    previous handlers are restored afterwards. Elsewhere, or nested, it does nothing."""
    if threading.current_thread() is not threading.main_thread() or getattr(_handling, "on", False):
        yield
        return
    fired: list[int] = []

    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise Interrupted(signum)

    previous = {}
    for sig in STOP_SIGNALS:
        try:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):      # not settable here
            pass
    _handling.on = True
    try:
        yield
    finally:
        _handling.on = False
        for sig, h in previous.items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)


# what checkpoint.pt must hold for a trainer to resume from it (``RunRecorder`` checks its own keys)
CHECKPOINT_KEYS = {"ps": dict, "steps": int, "updates": int, "update_count": int, "wall_s": (int, float),
                   "torch_rng": torch.Tensor, "numpy_rng": (list, tuple),
                   "python_rng": (list, tuple), "config": dict, "backend": str}
PS_KEYS = {"version": int, "online": dict, "target": dict, "optimizers": dict}


def _first_line(e: BaseException, limit: int = 240) -> str:
    """An exception's message as one line (its lines joined), at most ``limit`` characters."""
    text = "; ".join(line.strip().rstrip(":") for line in str(e).splitlines() if line.strip()) or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _field_spec(fields: dict) -> dict:
    """Replay fields as ``{name: (shape, dtype)}`` in one form, to compare a buffer's with a run's."""
    return {k: (tuple(shape) if isinstance(shape, (tuple, list)) else (shape,), np.dtype(dtype))
            for k, (shape, dtype) in fields.items()}


class DriverSchedule:
    """The driver's evaluations, ``stop_return`` and periodic checkpoints, by env steps (every backend)."""

    def __init__(self, tr: Driver):
        cfg = tr.cfg
        self.tr = tr
        self.next_eval = (len(tr.evals) and tr.evals[-1]["env_steps"] + cfg.eval_interval) or cfg.eval_interval
        self.next_ckpt = tr.rate.steps + cfg.checkpoint_interval if cfg.checkpoint_interval else None

    def tick(self, checkpoint: Callable[[], object]) -> bool:
        """Evaluate and ``checkpoint()`` where due; True when an evaluation reached ``stop_return``
        (``tr.reached_return`` is set: stop the run)."""
        tr, cfg = self.tr, self.tr.cfg
        if cfg.eval_interval and cfg.eval_episodes and tr.rate.steps >= self.next_eval:
            row = tr.evaluate()
            self.next_eval += cfg.eval_interval
            if cfg.stop_return is not None and row["mean_return"] >= cfg.stop_return:
                tr.reached_return = row
                return True
        if self.next_ckpt is not None and tr.rate.steps >= self.next_ckpt:
            checkpoint()
            self.next_ckpt += cfg.checkpoint_interval
        return False


class Driver(RunCore):
    """What a run is on every backend: config, seeds, the run's clock and counters, its ``RunRecorder`` (logs,
    checkpoints), evaluation, the summary and checkpoint state. A backend places the parameter server, the buffer
    and the rate counters (``_place``) and runs its workers (``run``, ``close``)."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, overwrite: bool = False):
        """``resume``: continue the run in ``cfg.run_dir()`` from its last checkpoint. Otherwise a directory that
        holds a run already (its summary or a checkpoint) is refused unless ``overwrite``: then the new run
        replaces that run's files when it starts. The run directory is locked (``RunLock``) before anything is
        read or removed there, until ``close``: a second run of it is refused (``RunLocked``) and changes
        nothing."""
        validate(cfg)
        if resume and overwrite:
            raise ConfigError("overwrite: resuming continues the run in its directory, overwriting replaces it; "
                              "give one of --resume and --overwrite")
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        super().__init__(cfg)
        self.recorder = RunRecorder(cfg.run_dir(), cfg.run_name(), quiet=cfg.progress)
        self.run_dir = self.recorder.run_dir
        self.stop = threading.Event()
        self.timers: dict = {}
        self._lock = threading.Lock()
        self.reached_return: dict | None = None         # the evaluation that reached cfg.stop_return
        self.eval_seconds = 0.0                         # seconds spent evaluating so far
        self.update_count = 0
        self.resumed_steps = 0
        self.t0 = time.perf_counter()
        self.wall_offset = 0.0
        self.train_wall_s: float | None = None          # wall time when the workers had stopped
        self.startup_s = 0.0                            # workers' set-up before the clock started (processes, Ray)
        self._closed = False
        # the run lock first (one run per directory, every backend): a second run changes nothing there
        self.recorder.lock(create=not resume)
        try:
            # read a checkpoint before anything (threads, shared segments, Ray actors) exists, so a run that
            # cannot be resumed fails leaving nothing behind
            self.recorder.check_layout()
            state = None
            if resume:
                state = self.recorder.load_checkpoint()
                self._check_state(state)
            elif not overwrite and (found := self.recorder.existing_run()) is not None:
                raise ConfigError(f"name: {self.run_dir} holds a run already ({found}); continue it with --resume, "
                                  f"replace it with --overwrite, or choose another --name")
            self._fresh = not resume                        # run() clears what a replaced run left
            if state is not None and state["steps"] >= cfg.steps:
                raise ConfigError(f"steps: the run in {self.run_dir} has done {state['steps']} steps already, not "
                                  f"fewer than steps = {cfg.steps}; give a larger --steps to continue it")
            self._place()
        except BaseException:
            self.recorder.unlock()
            raise
        if state is not None:
            try:
                self._restore(state)
            except BaseException:
                self.close()          # a backend's shared segments go with it
                self.recorder.unlock()
                raise

    def _place(self) -> None:
        """Where the parameter server (``ps``), the replay buffer (``buffer``) and the rate counters (``rate``)
        live: the backend's."""
        raise NotImplementedError
    @property
    def episodes(self) -> list[tuple[int, float, int, float]]:
        return self.recorder.episodes

    @episodes.setter
    def episodes(self, rows) -> None:
        self.recorder.episodes[:] = rows

    @property
    def evals(self) -> list[dict]:
        return self.recorder.evals

    @property
    def events(self) -> list[dict]:
        return self.recorder.events

    def _event(self, worker: str, event: str, lost: int, detail: str) -> None:
        self.recorder.event(self.wall(), self.rate.steps, worker, event, lost, detail)

    # ------------------------------------------------------------------ the replay buffer (a backend may share it)

    def _new_buffer(self, fields: dict):
        return make_buffer(self.cfg, fields)

    def _load_buffer(self, path: Path):
        return buffer_class(self.cfg).load(path)

    # ------------------------------------------------------------------ helpers used by workers

    def record_episode(self, ret: float, length: int) -> None:
        with self._lock:
            self.episodes.append((self.rate.steps, ret, length, self.wall()))

    def next_update_index(self) -> int:
        with self._lock:
            self.update_count += 1
            return self.update_count

    def wall(self) -> float:
        return self.wall_offset + time.perf_counter() - self.t0

    # ------------------------------------------------------------------ threads






    def _start_files(self) -> None:
        """config.yaml, after clearing the files of the run this one replaces (not when resuming)."""
        if self._fresh:
            self.recorder.clear()
            self._fresh = False
        self.recorder.write_config(self.cfg.to_dict())







    def close(self) -> None:
        """Release what the run holds (idempotent), the run lock last; a backend stops its workers first."""
        self._closed = True
        self.recorder.unlock()

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        self.recorder.unlock()        # a backend's close that does not end in this one's (Ray's)

    # ------------------------------------------------------------------ evaluation, logs

    def evaluate(self) -> dict:
        """Mean return of ``eval_episodes`` greedy episodes with the latest published weights. With
        ``eval_pauses_training`` the actors and learners wait at a step boundary meanwhile, so that the row's
        ``train_s`` (seconds at its start less earlier evaluations) is training time alone."""
        pause = self.cfg.eval_pauses_training
        if pause:
            self.rate.pause(self.stop)
        t0 = self.wall()
        try:
            snap = self.ps.snapshot
            steps, updates = self.rate.steps, self.rate.done
            returns = self.greedy_returns(snap.online)
        finally:
            if pause:
                self.rate.resume()
        took = self.wall() - t0
        row = {"env_steps": steps, "updates": updates, "version": snap.version,
               "wall_s": round(t0 + took, 3), "mean_return": float(np.mean(returns)),
               "std_return": float(np.std(returns)), "eval_s": round(took, 3),
               "train_s": round(t0 - self.eval_seconds, 3)}
        self.eval_seconds += took
        self.recorder.evaluation(row)
        return row

    def _write_logs(self) -> None:
        self.recorder.write_logs(self.summary())

    def summary(self) -> dict:
        recent = [r for _, r, _, _ in self.episodes[-20:]]
        wall = self.train_wall_s if self.train_wall_s is not None else self.wall()
        return {
            "algo": self.cfg.algo, "env": self.cfg.env, "actors": self.cfg.actors, "learners": self.cfg.learners,
            "aggregation": self.cfg.aggregation, "env_steps": self.rate.steps, "updates": self.rate.done,
            "ps_steps": self.ps.version, "dropped_stale_gradients": self.ps.dropped_stale,
            "episodes": len(self.episodes), "wall_s": round(wall, 3), "startup_s": round(self.startup_s, 3),
            "env_steps_per_s": round(self.rate.steps / max(wall, 1e-9), 1),
            "updates_per_s": round(self.rate.done / max(wall, 1e-9), 1),
            "updates_per_step": (self.rate.done / max(1, self.rate.steps - self.cfg.learning_starts)),
            "mean_return_last20": float(np.mean(recent)) if recent else None,
            "final_eval_return": self.evals[-1]["mean_return"] if self.evals else None,
            "reached_return": self.reached_return,
            "eval": self.evals, "eval_s": round(self.eval_seconds, 3), "run_dir": str(self.run_dir),
            "phase_seconds": {k: {p: round(s, 4) for p, s in t.seconds.items()} for k, t in self.timers.items()}
            | ({} if self.ps.direct else {"parameter-server": self._ps_phases(wall)}),
            "rate_wait_s": self.rate.wait_s,
            "actor_epsilons": ([self.actor_epsilon(a) for a in range(self.cfg.actors)]
                               if self.cfg.exploration == "apex" and self.cfg.algo in Q_ALGOS else None),
            "buffer_lock": self.buffer.lock_stats(),
        }

    def _ps_phases(self, wall: float) -> dict:
        busy = self.ps.times["aggregate_s"] + self.ps.times["publish_s"]
        return {"aggregate": round(self.ps.times["aggregate_s"], 4), "publish": round(self.ps.times["publish_s"], 4),
                "idle": round(max(0.0, wall - busy), 4)}

    def _progress_bar(self):
        if not self.cfg.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=self.cfg.steps, initial=self.rate.steps, unit="step", dynamic_ncols=True,
                    desc=f"{self.cfg.algo} {self.cfg.env}")

    def _update_progress(self, bar) -> None:
        if bar is None:
            return
        bar.update(self.rate.steps - bar.n)
        wall = max(self.wall(), 1e-9)
        recent = [r for _, r, _, _ in self.episodes[-20:]]
        bar.set_postfix(episodes=len(self.episodes), ret=f"{np.mean(recent):.1f}" if recent else "-",
                        steps_s=f"{self.rate.steps / wall:.0f}", upd_s=f"{self.rate.done / wall:.0f}", refresh=False)

    # ------------------------------------------------------------------ checkpoints

    def _paused_checkpoint(self) -> None:
        """``save_checkpoint`` with actors and learners paused at a step boundary (a consistent buffer
        and weights); skipped if the run is stopping."""
        if self.rate.pause(self.stop):
            self.save_checkpoint()
        self.rate.resume()

    def _checkpoint_state(self, ps_state: dict, steps: int, updates: int) -> dict:
        """What every backend's checkpoint holds besides the logs (``RunRecorder.save_checkpoint`` adds them):
        tensors, numbers, strings and containers only (numpy's RNG state as a list). The actors' random state is
        not in it: a resumed run derives it again (``supervision.actor_rng``)."""
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        return {"ps": ps_state, "steps": steps, "updates": updates, "update_count": updates,
                "wall_s": self.wall(),
                "torch_rng": torch.get_rng_state(),
                "numpy_rng": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
                "python_rng": random.getstate(), "config": self.cfg.to_dict(), "backend": self.cfg.backend}

    def save_checkpoint(self) -> Path:
        """Weights, optimizers, targets, counters, RNG states (checkpoint.pt) and the buffer (buffer.pal), as one
        new checkpoint directory (``RunRecorder.save_checkpoint``); returns checkpoint.pt's path."""
        state = self._checkpoint_state(self.ps.state_dict(), self.rate.steps, self.rate.done)

        def write_buffer(path: Path) -> int:
            self.buffer.save(path)
            return self.buffer.total_added

        return self.recorder.save_checkpoint(state | {"update_count": self.update_count}, write_buffer)

    @staticmethod
    def _check_state(state: dict) -> None:
        """``RunFileError`` naming checkpoint.pt unless it holds what a trainer resumes from."""
        path = state["checkpoint_file"]
        check_keys(state, CHECKPOINT_KEYS, path)
        check_keys(state["ps"], PS_KEYS, path, "ps.")
        if state["buffer_file"] is None:
            raise RunFileError(f"{path}: a checkpoint saved without its replay buffer")

    def _restore(self, state: dict) -> None:
        """Counters, weights, RNG states and the buffer of a loaded checkpoint (the logs are the recorder's); a
        checkpoint or buffer that does not fit this run is a ``RunFileError`` naming the file."""
        path = state["checkpoint_file"]
        try:
            self.ps.load_state_dict(state["ps"])
            torch.set_rng_state(state["torch_rng"])
            kind, keys, pos, has_gauss, cached = state["numpy_rng"]
            np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
            version, internal, gauss = state["python_rng"]
            random.setstate((version, tuple(internal), gauss))
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, OverflowError, AttributeError) as e:
            raise RunFileError(f"{path}: does not fit this run ({_first_line(e)})") from None
        self.rate.restore(state["steps"], state["updates"])
        self.update_count = state["update_count"]
        self.wall_offset = state["wall_s"]
        self.eval_seconds = sum(float(e.get("eval_s") or 0.0) for e in self.evals)
        self.buffer = self._restore_buffer(state)
        self.resumed_steps = state["steps"]

    def _restore_buffer(self, state: dict, load: Callable | None = None):
        """The checkpoint's replay buffer (read with ``load``, by default ``_load_buffer``), refused unless it has
        this run's fields and capacity and the ``total_added`` its checkpoint recorded (the pair is of one moment)."""
        path = state["buffer_file"]
        want = _field_spec(self.fields())
        try:
            buf = (load or self._load_buffer)(path)
        except ValueError as e:
            text = _first_line(e)
            raise RunFileError(text if text.startswith(str(path)) else f"{path}: {text}") from None
        except OSError as e:
            raise RunFileError(f"{path}: cannot be read ({e.strerror or e})") from None
        try:
            self._check_buffer(buf, state, want)
        except BaseException:
            buf.close()
            raise
        return buf

    def _check_buffer(self, buf, state: dict, want: dict) -> None:
        path = state["buffer_file"]
        got = _field_spec(buf.fields)
        if got != want:
            diff = sorted(set(got.items()) ^ set(want.items()))
            names = ", ".join(dict.fromkeys(k for k, _ in diff))
            raise RunFileError(f"{path}: a buffer with other fields than this run's (they differ in {names}): it "
                               f"belongs to another run; refused")
        if buf.capacity != self.cfg.buffer_capacity:
            raise RunFileError(f"{path}: a buffer of capacity {buf.capacity}, this run's is "
                               f"{self.cfg.buffer_capacity}: it belongs to another run; refused")
        if buf.total_added != state["buffer_total_added"]:
            raise RunFileError(f"{path}: holds {buf.total_added} transitions, but its checkpoint "
                               f"{state['checkpoint_file']} was written with {state['buffer_total_added']}: the "
                               f"two files are from different moments; refused")
