"""What a run leaves in its directory, written the same way by every backend:

- ``config.yaml``: the run's config (at the start);
- ``eval.csv``: one row per greedy evaluation (rewritten after each, so a long run can be watched);
- ``events.csv``: restarts, timeouts and reloads of workers, with the transitions each one lost;
- ``episodes.csv``, ``summary.json`` and ``learning_curve.png``: at the end (before the final checkpoint, so a
  checkpoint that cannot be written, e.g. on a full disk, still leaves them);
- ``checkpoints/``: the last complete checkpoint, a directory ``step-<steps>-<random>/`` holding
  ``checkpoint.pt`` (counters, logs, RNG states and whatever the backend adds: weights, optimizers) and
  ``buffer.pal`` (the replay buffer), and ``checkpoints/latest.json``, the pointer naming it.

Every file is written through ``atomic_open``: a crash never leaves one half-written over a good one.

A checkpoint is a pair written at one moment: both files go into a new directory, then the pointer is replaced
(atomically) to name it, then older directories are removed. A kill at any point leaves the pointer naming a
complete pair (the previous one until the new pointer is in place); a directory the pointer does not name is
removed by the next checkpoint. Both files record the step they belong to and the buffer's next id
(``buffer_total_added``), the pointer too; resuming refuses (``RunFileError``) a pair whose records differ.

``checkpoint.pt`` holds tensors, numbers, strings and plain containers only and is read with
``torch.load(weights_only=True)``: a file that would build anything else (a pickle that calls a function) is
refused, never run. Run directories of the earlier layout (``checkpoint.pt`` and ``buffer.pal`` beside
``config.yaml``) are refused in one line: their pickles are not of that kind and their pair cannot be checked.

The run directory's files are data, not trusted: ``latest.json`` is opened without following a link or blocking
(a FIFO, a link to ``/dev/zero``), must be a small regular file and name a checkpoint directory by its exact
pattern, a real directory inside ``checkpoints/``; ``checkpoints/`` itself must be a real directory (not a link).
Only what this code made is ever removed: checkpoint directories of the exact ``step-<steps>-<hex>`` pattern (real
directories, not links) and the temporary files a killed write of ``latest.json`` left; anything else a user put
into ``checkpoints/`` stays.

One run at a time per directory (``RunLock``): a run holds an exclusive ``flock`` on ``<run>/.lock`` (holding its
pid, for the message that refuses a second run) from its start to its close; the kernel releases it on any death,
so a killed run never blocks the next. The lock file stays; it is not a sign that a run was made there.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import sys
import weakref
from collections.abc import Callable
from pathlib import Path

from pal_bench.atomic import atomic_open, fsync_dir
from pal_bench.train.config import ConfigError

CHECKPOINTS = "checkpoints"          # the run directory's checkpoint directory
LATEST = "latest.json"               # in it: the pointer to the last complete checkpoint
FORMAT = 2                           # checkpoint layout (1: checkpoint.pt + buffer.pal beside config.yaml)
LOCK = ".lock"                       # in the run directory: the run lock (``RunLock``)
MAX_POINTER_BYTES = 4096             # latest.json is about 150 bytes; anything larger is not one of ours
MAX_COUNT = 2**63 - 1                # steps and buffer ids are int64 counters
# what save_checkpoint names a checkpoint directory: step-<steps, zero-padded to 12 digits>-<8 hex digits>
_CHECKPOINT_NAME = re.compile(r"step-(\d{12,19})-[0-9a-f]{8}")
# what a killed atomic_open of latest.json leaves: .latest.json.<pid>.<thread id>.<8 hex digits>.tmp
_POINTER_TMP = re.compile(re.escape(f".{LATEST}.") + r"\d+\.\d+\.[0-9a-f]{8}\.tmp")
# files a run writes into its directory (``clear`` removes them before a run replaces another: --overwrite)
RUN_FILES = ("config.yaml", "eval.csv", "events.csv", "episodes.csv", "summary.json", "learning_curve.png",
             "profile.png", "checkpoint.pt", "buffer.pal", "buffer_actor.pal", "buffer_actor.pal.json")


class RunFileError(ConfigError):
    """A run file that cannot be used (damaged, of another run or moment, or not plain data); the message names
    the file and what is wrong with it."""


class RunLocked(ConfigError):
    """The run directory is in use by another run (its ``RunLock`` is held); the message names the directory and
    the holder's pid."""


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is exactly what ``save_checkpoint`` names a checkpoint directory: ``step-`` and the steps
    zero-padded to 12 digits (more digits only without a leading zero), ``-`` and 8 lowercase hex digits."""
    m = _CHECKPOINT_NAME.fullmatch(name)
    return m is not None and f"{int(m[1]):012d}" == m[1] and int(m[1]) <= MAX_COUNT


def _mode(path: Path) -> int:
    """``path``'s ``st_mode``, a link not followed; 0 when it is missing."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return 0


def _not_a_dir(mode: int) -> str | None:
    """What a ``_mode`` is if not a real directory ("missing", "a symbolic link", "not a directory"), else None."""
    if stat.S_ISDIR(mode):
        return None
    return "missing" if not mode else "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/.lock`` (opened without following a link, created if missing, refused
    if it is not a plain file with one name (a hard link), the holder's pid written into it), held until
    ``release`` or until the process dies (the kernel releases it). A second holder is refused at once
    (``RunLocked``, naming the directory and the holder's pid), never kept waiting. ``create``: make the run
    directory if it is missing (otherwise ``FileNotFoundError``)."""

    def __init__(self, run_dir: Path, create: bool = True):
        path = run_dir / LOCK
        if create:
            run_dir.mkdir(parents=True, exist_ok=True)
        elif not run_dir.is_dir():
            raise FileNotFoundError(f"no checkpoint to resume from in {run_dir} (no such directory)")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise RunFileError(f"{path}: a symbolic link, not the run lock (a plain file); refused") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RunFileError(f"{path}: not a regular file, not the run lock; refused")
            if st.st_nlink != 1:         # a hard link: another file's contents (or another run's lock, cp -al)
                raise RunFileError(f"{path}: has {st.st_nlink} names (a hard link to another file, or a copy made "
                                   f"with cp -al); refused, nothing written: remove {LOCK} to use this directory")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                raise RunLocked(f"{run_dir} is in use by another run (pid {holder if holder.isdigit() else '?'}, "
                                f"holding {LOCK}); wait for it to end, or choose another --name") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self.path = path
        self._close = weakref.finalize(self, os.close, fd)     # released with this object, if never by release()

    def release(self) -> None:
        """Release the lock (idempotent); the file stays."""
        self._close()


# wall_s: when the evaluation ended; eval_s: its seconds; train_s: run seconds at its start less earlier evaluations
EVAL_FIELDS = ["env_steps", "updates", "version", "wall_s", "mean_return", "std_return", "eval_s", "train_s"]
EVENT_FIELDS = ["wall_s", "env_steps", "worker", "event", "transitions_lost", "detail"]
EPISODE_FIELDS = ["env_steps", "return", "length", "wall_s"]


class RunRecorder:
    """The logs of one run (episodes, evaluations, events) and the files they go to in ``run_dir``."""

    def __init__(self, run_dir: Path, run_name: str, quiet: bool = False):
        self.run_dir = run_dir
        self.run_name = run_name
        self.quiet = quiet                 # a progress bar shows evaluations: no line per evaluation
        self.episodes: list[tuple[int, float, int, float]] = []   # (env steps, return, length, wall s)
        self.evals: list[dict] = []
        self.events: list[dict] = []
        self._lock: RunLock | None = None

    def _say(self, text: str) -> None:
        print(f"[{self.run_name}] {text}", file=sys.stderr, flush=True)

    def _write_csv(self, name: str, fieldnames: list[str], rows: list) -> None:
        """Rows are dicts keyed by ``fieldnames`` or tuples in their order."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with atomic_open(self.run_dir / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(fieldnames)
            w.writerows([r.get(k, "") for k in fieldnames] if isinstance(r, dict) else r for r in rows)

    def write_config(self, config: dict) -> None:
        import yaml

        self.run_dir.mkdir(parents=True, exist_ok=True)
        with atomic_open(self.run_dir / "config.yaml", "w") as f:
            f.write(yaml.safe_dump(config, sort_keys=False))

    def evaluation(self, row: dict) -> None:
        """Record one evaluation (keys ``EVAL_FIELDS``) and rewrite eval.csv."""
        self.evals.append(row)
        self._write_csv("eval.csv", EVAL_FIELDS, self.evals)
        if not self.quiet:
            self._say(f"eval at {row['env_steps']} steps, {row['wall_s']:.0f} s: "
                      f"return {row['mean_return']:.1f} ± {row['std_return']:.1f}")

    def event(self, wall_s: float, env_steps: int, worker: str, event: str, lost: int, detail: str) -> None:
        """Record a worker event (a restart, a timeout, a reload) with the transitions it lost; rewrite events.csv."""
        self.events.append({"wall_s": round(wall_s, 3), "env_steps": env_steps, "worker": worker, "event": event,
                            "transitions_lost": lost, "detail": detail})
        self._say(f"{worker} {event}: {detail}")
        self._write_csv("events.csv", EVENT_FIELDS, self.events)

    def write_logs(self, summary: dict) -> None:
        """eval.csv, episodes.csv, events.csv (when there were events), summary.json and the learning curve."""
        self._write_csv("eval.csv", EVAL_FIELDS, self.evals)
        self._write_csv("episodes.csv", EPISODE_FIELDS, self.episodes)
        if self.events:
            self._write_csv("events.csv", EVENT_FIELDS, self.events)
        with atomic_open(self.run_dir / "summary.json", "w") as f:
            f.write(json.dumps(summary, indent=1))
        try:
            from pal_bench.train.plots import learning_curve

            learning_curve(self.run_dir)
        except ImportError:
            pass

    # ------------------------------------------------------------------ the run directory

    def lock(self, create: bool = True) -> None:
        """Take the run lock (``RunLock``) for this recorder's life: ``RunLocked`` if another run holds it."""
        if self._lock is None:
            self._lock = RunLock(self.run_dir, create)

    def unlock(self) -> None:
        """Release the run lock (idempotent)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def detach_lock(self) -> RunLock | None:
        """The run lock, which ``unlock`` then leaves held: the caller releases it (after what it still holds of
        the run)."""
        lock, self._lock = self._lock, None
        return lock

    def check_layout(self) -> None:
        """``RunFileError`` when ``checkpoints/`` is a symbolic link or not a directory: checkpoints are written
        into, and old ones removed from, a real directory of this run only."""
        root = self.run_dir / CHECKPOINTS
        mode = _mode(root)
        if mode and (wrong := _not_a_dir(mode)) is not None:
            raise RunFileError(f"{root}: {wrong}; a run keeps its checkpoints in a directory of its own there "
                               f"(move it away to go on)")

    def existing_run(self) -> str | None:
        """What shows that a run was made in ``run_dir`` already (its summary or a checkpoint), or None."""
        for name in (f"{CHECKPOINTS}/{LATEST}", "summary.json", "checkpoint.pt"):
            if os.path.lexists(self.run_dir / name):
                return name
        return None

    def clear(self) -> None:
        """Remove the files a run writes (``RUN_FILES``, and in ``checkpoints/`` the pointer and what
        ``_remove_ours`` removes) from ``run_dir``, before a new run replaces the one there; other files (the run
        lock, anything of the user's) are left alone."""
        self.check_layout()
        for name in RUN_FILES:
            (self.run_dir / name).unlink(missing_ok=True)
        root = self.run_dir / CHECKPOINTS
        if root.is_dir():
            (root / LATEST).unlink(missing_ok=True)
            self._remove_ours(root)
            try:
                root.rmdir()                   # only when nothing else is in it
            except OSError:
                pass

    @staticmethod
    def _remove_ours(root: Path, keep: str | None = None) -> None:
        """Remove from ``root`` the checkpoint directories (exact name, real directories, not links) but ``keep``
        and the temporary files a killed write of the pointer left; nothing else."""
        with os.scandir(root) as entries:
            for e in entries:
                if e.name != keep and is_checkpoint_name(e.name) and e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                elif _POINTER_TMP.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                    try:
                        os.unlink(e.path)
                    except FileNotFoundError:
                        pass

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, state: dict | Callable[[], dict], write_buffer: Callable[[Path], int] | None = None,
                        steps: int | None = None) -> Path:
        """A new checkpoint: ``write_buffer(path)`` writes the replay buffer to ``path`` and returns its
        ``total_added``; checkpoint.pt holds ``state`` (the backend's weights and counters; tensors, numbers,
        strings and containers, numpy values converted) plus the logs and the buffer's ``total_added``. ``state``
        may be a function, called once the buffer is written (a backend whose counters are known only then;
        ``steps`` then names the directory). Both files go into a new directory under ``checkpoints/``, then
        ``latest.json`` is replaced to name it and older directories are removed. Refuses (``Diverged``) weights
        that are not finite, before writing checkpoint.pt. On an error nothing of the new checkpoint is left and
        the previous one stays the last. Returns checkpoint.pt's path."""
        import torch

        if not callable(state):
            _refuse_non_finite(state)
        root = self.run_dir / CHECKPOINTS
        self.check_layout()
        root.mkdir(parents=True, exist_ok=True)
        label = int(state["steps"]) if not callable(state) else int(steps or 0)
        while True:
            d = root / f"step-{label:012d}-{secrets.token_hex(4)}"
            try:
                d.mkdir()
                break
            except FileExistsError:
                continue
        published = False
        try:
            total = int(write_buffer(d / "buffer.pal")) if write_buffer is not None else None
            if callable(state):
                state = state()
                _refuse_non_finite(state)
            payload = to_plain(state | {"format": FORMAT, "buffer_total_added": total, "episodes": self.episodes,
                                        "evals": self.evals, "events": self.events})
            with atomic_open(d / "checkpoint.pt", "wb") as f:
                torch.save(payload, f)
            fsync_dir(d)
            pointer = {"format": FORMAT, "checkpoint": d.name, "steps": int(state["steps"]),
                       "updates": state.get("updates"),
                       "buffer_total_added": total}
            with atomic_open(root / LATEST, "w") as f:
                f.write(json.dumps(pointer, indent=1) + "\n")
            published = True
            fsync_dir(root)
        except OSError as e:
            raise OSError(e.errno, f"cannot write a checkpoint into {d}: {e.strerror or e}") from e
        finally:
            if not published:
                shutil.rmtree(d, ignore_errors=True)
        self._remove_ours(root, keep=d.name)     # older checkpoints, and what a killed write left
        return d / "checkpoint.pt"

    def checkpoint_files(self) -> tuple[Path, Path | None]:
        """(checkpoint.pt, buffer.pal or None) of the last complete checkpoint, from ``checkpoints/latest.json``;
        ``FileNotFoundError`` when there is none, ``RunFileError`` when the pointer is damaged or the run is of the
        earlier layout."""
        root = self.run_dir / CHECKPOINTS
        latest = root / LATEST
        self.check_layout()
        if not os.path.lexists(latest):
            if (self.run_dir / "checkpoint.pt").exists():
                raise RunFileError(
                    f"{self.run_dir / 'checkpoint.pt'}: a checkpoint of an earlier PAL-Bench (beside buffer.pal, no "
                    f"{CHECKPOINTS}/{LATEST}): it cannot be read without running its pickle, nor matched to its "
                    f"buffer, so it is not resumed; start the run again with --overwrite (or another --name)")
            raise FileNotFoundError(f"no checkpoint to resume from in {self.run_dir} (no {CHECKPOINTS}/{LATEST})")
        pointer = self._pointer(latest)
        d = root / pointer["checkpoint"]
        wrong = _not_a_dir(_mode(d))
        if wrong is not None:
            raise RunFileError(f"{latest}: names {pointer['checkpoint']}, which is {wrong}, not a checkpoint "
                               f"directory of this run")
        if not stat.S_ISREG(_mode(d / "checkpoint.pt")):
            raise RunFileError(f"{latest}: names {pointer['checkpoint']}, which holds no checkpoint.pt (a regular "
                               f"file)")
        return d / "checkpoint.pt", (d / "buffer.pal" if pointer["buffer_total_added"] is not None else None)

    @staticmethod
    def _pointer(latest: Path) -> dict:
        """``latest.json`` read as untrusted data: opened without following a link or blocking, a regular file
        of at most ``MAX_POINTER_BYTES``, JSON of the expected fields; anything else is a ``RunFileError``."""
        try:
            fd = os.open(latest, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            what = "a symbolic link" if e.errno == errno.ELOOP else f"cannot be opened ({e.strerror or e})"
            raise RunFileError(f"{latest}: {what}, not a checkpoint pointer; refused") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RunFileError(f"{latest}: not a regular file, not a checkpoint pointer; refused")
            data = os.read(fd, MAX_POINTER_BYTES + 1)
        except OSError as e:
            raise RunFileError(f"{latest}: cannot be read ({e.strerror or e})") from None
        finally:
            os.close(fd)
        if len(data) > MAX_POINTER_BYTES:
            raise RunFileError(f"{latest}: more than {MAX_POINTER_BYTES} bytes, too large for a checkpoint pointer; "
                               f"refused")
        try:
            pointer = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as e:       # JSONDecodeError, UnicodeDecodeError, an int too long
            text = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise RunFileError(f"{latest}: not a checkpoint pointer (not JSON of one: {text})") from None
        ok = (isinstance(pointer, dict) and pointer.get("format") == FORMAT
              and isinstance(pointer.get("checkpoint"), str) and is_checkpoint_name(pointer["checkpoint"])
              and _is_count(pointer.get("steps"))
              and (pointer.get("buffer_total_added") is None or _is_count(pointer.get("buffer_total_added"))))
        if not ok:
            raise RunFileError(f"{latest}: not a checkpoint pointer of format {FORMAT} (expected format, checkpoint "
                               f"step-<steps>-<hex>, steps and buffer_total_added)")
        return pointer

    def load_checkpoint(self) -> dict:
        """The state saved by ``save_checkpoint`` (read as plain data: ``torch.load(weights_only=True)``), checked
        against the pointer that names it; the logs are restored into this recorder. The returned dict also
        holds ``checkpoint_file`` and ``buffer_file`` (None when saved without a buffer): the paths it came from.
        Anything wrong with the files is a ``RunFileError`` naming the file."""
        path, buffer_file = self.checkpoint_files()
        pointer = self._pointer(self.run_dir / CHECKPOINTS / LATEST)
        state = load_plain(path)
        check_keys(state, {"format": int, "steps": int, "buffer_total_added": (int, type(None)), "episodes": list,
                           "evals": list, "events": list}, path)
        if state["format"] != FORMAT:
            raise RunFileError(f"{path}: a checkpoint of format {state['format']}, expected {FORMAT}")
        for key in ("steps", "buffer_total_added"):
            if state[key] != pointer[key]:
                raise RunFileError(f"{path}: records {key} = {state[key]}, but {CHECKPOINTS}/{LATEST} names it with "
                                   f"{pointer[key]}: the files are from different moments; refused")
        try:
            episodes = [(int(s), float(r), int(n), float(w)) for s, r, n, w in state["episodes"]]
            if not all(isinstance(row, dict) for row in state["evals"] + state["events"]):
                raise TypeError("an evaluation or event that is not a table row")
        except (TypeError, ValueError) as e:
            raise RunFileError(f"{path}: damaged logs ({e})") from None
        self.episodes[:] = episodes
        self.evals[:] = state["evals"]
        self.events[:] = state["events"]
        return state | {"checkpoint_file": path, "buffer_file": buffer_file}


# ---------------------------------------------------------------------- checkpoint contents: plain data only

def _is_count(x) -> bool:
    """A non-negative int that fits the int64 counters (not a bool)."""
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_COUNT


def to_plain(x, where: str = "state"):
    """``x`` with numpy scalars and arrays turned into Python numbers and lists, so that it holds only what
    ``torch.load(weights_only=True)`` reads (tensors, numbers, strings, None, lists, tuples, dicts); the same
    objects where nothing changes. Anything else is a ``TypeError`` naming where it is."""
    import numpy as np
    import torch

    if x is None or isinstance(x, (bool, int, float, str, bytes, torch.Tensor, torch.Size, torch.dtype)):
        return x
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        items = {k: to_plain(v, f"{where}[{k!r}]") for k, v in x.items()}
        if all(items[k] is x[k] for k in x):
            return x
        out = type(x)(items)
        if hasattr(x, "_metadata"):                    # a module's state_dict keeps its version metadata
            out._metadata = x._metadata
        return out
    if type(x) in (list, tuple):
        items = [to_plain(v, f"{where}[{i}]") for i, v in enumerate(x)]
        return x if all(a is b for a, b in zip(items, x)) else type(x)(items)
    raise TypeError(f"a checkpoint holds tensors, numbers, strings and containers only; {where} is a "
                    f"{type(x).__module__}.{type(x).__qualname__}")


def load_plain(path: Path):
    """``torch.load(path, weights_only=True)`` (no code from the file runs: only tensors and plain values are
    built), with every failure a ``RunFileError`` naming the file."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:     # noqa: BLE001 - torch raises many kinds for a damaged file; all are the file's fault
        text = str(e)
        found = re.search(r"GLOBAL (\S+)", text)
        if found is not None:
            what = found.group(1).rstrip(".,")
            raise RunFileError(f"{path}: refused: it would build {what}, which is not a tensor or plain data, and "
                               f"loading it could run code") from None
        first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
        raise RunFileError(f"{path}: not a readable checkpoint (damaged, truncated or not a checkpoint: "
                           f"{first[:160]})") from None


def check_keys(state, spec: dict, path: Path, where: str = "") -> None:
    """``RunFileError`` naming ``path`` unless ``state`` is a dict with every key of ``spec`` (key -> type or tuple
    of types) of its type (bool is not an int)."""
    if not isinstance(state, dict):
        raise RunFileError(f"{path}: not a checkpoint ({where or 'the file'} holds a {type(state).__name__}, "
                           f"not a table)")
    missing = [k for k in spec if k not in state]
    if missing:
        raise RunFileError(f"{path}: not a complete checkpoint: {where}missing {', '.join(missing)}")
    for k, types in spec.items():
        types = types if isinstance(types, tuple) else (types,)
        v = state[k]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise RunFileError(f"{path}: {where}{k} is a {type(v).__name__}, expected {names}")


def _refuse_non_finite(state: dict) -> None:
    """``Diverged`` when a floating-point weight of ``state["ps"]`` (online or target networks) is NaN or inf."""
    import torch

    from pal_bench.train.errors import Diverged

    ps = state.get("ps") if isinstance(state, dict) else None
    if not isinstance(ps, dict):
        return
    for part in ("online", "target"):
        for name, t in (ps.get(part) or {}).items():
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise Diverged(f"training diverged: non-finite weights ({part} {name}) at {state.get('steps')} steps; "
                               f"no checkpoint is written from this state")
