"""``pal-bench shm``: the shared-memory segments PAL-Bench made (replay buffers and weight blocks) in /dev/shm, with
their creator's pid, size and whether the creator is alive; ``--clean`` removes those whose creator is gone.

A creator that exits, is interrupted or gets SIGTERM/SIGHUP removes its own segments. What no handler can catch
(SIGKILL, the OOM killer, power loss) leaves them behind: this lists and removes them. A segment is recognised by
the magic number in its header, never by its name, so nothing else in /dev/shm is touched. Its creator counts as
alive while it holds its flock on the segment (which works across pid namespaces: containers sharing /dev/shm)
or while its pid is a live process here (pid reuse can only keep a dead one's segment, never remove a live one's).

A segment ``--clean`` may not remove (another user's, in a shared /dev/shm) is reported on one line and skipped;
the exit status is then 1 (0 when everything dead was removed). Names are printed with every non-printable
character escaped (``\\x1b``), so a hostile file name cannot write to the terminal.
"""

from __future__ import annotations

import argparse
import os
import sys

from pal_bench import _segment
from pal_bench.argtypes import printable
from pal_bench.train import shared_weights


def segments(directory: str = _segment.SHM_DIR) -> list[dict]:
    """Every PAL-Bench segment in ``directory``: ``{"name", "kind", "bytes", "creator_pid", "creator_alive"}``,
    sorted by name."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        info = _segment.segment_info(name)
        if info is not None and info["kind"] == "control":
            kind = f"control block, {info['capacity']} words"
        elif info is not None:
            kind = f"{info['kind']} buffer, {info['size']}/{info['capacity']} transitions"
        else:
            info = shared_weights.segment_info(name)
            if info is None:
                continue
            kind = "weights"
        out.append({"name": name, "kind": kind, "bytes": info["bytes"], "creator_pid": info["creator_pid"],
                    "creator_alive": info["creator_alive"]})
    return out


def _remove_if_dead(seg: dict) -> str:
    """``_segment.remove_if_dead`` for a segment of ``segments()`` (its magic and creator pid where its kind keeps
    them): ``"removed"``, ``"gone"``, ``"alive"`` or ``"foreign"``; ``OSError`` if the unlink is refused."""
    if seg["kind"] == "weights":
        how = (shared_weights.MAGIC, shared_weights.MAGIC_OFFSET, shared_weights.PID_OFFSET)
    else:
        how = (_segment.SEGMENT_MAGIC, 0, _segment.CREATOR_PID_OFFSET)
    return _segment.remove_if_dead(seg["name"], *how)


def clean() -> tuple[list[dict], list[tuple[dict, str]]]:
    """Remove the segments whose creator is gone (checked again, under an exclusive flock, just before each
    removal). Returns those removed, and ``(segment, reason)`` for each that could not be (another user's:
    ``"permission denied"``); one refused removal does not stop the others."""
    removed, failed = [], []
    for seg in segments():
        if seg["creator_alive"]:
            continue
        try:
            if _remove_if_dead(seg) == "removed":
                removed.append(seg)
        except PermissionError:
            failed.append((seg, "permission denied"))
        except OSError as e:
            failed.append((seg, (e.strerror or str(e)).lower()))
    return removed, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench shm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--clean", action="store_true", help="remove the segments whose creator process is gone; "
                    "exit status 1 if some could not be removed (another user's), 0 otherwise")
    args = ap.parse_args(argv)
    found = segments()
    if args.clean:
        gone, failed = clean()
        for seg in gone:
            print(f"removed {printable(seg['name'])} ({seg['bytes'] / 1e6:.1f} MB, creator pid "
                  f"{seg['creator_pid']} gone)")
        for seg, reason in failed:
            print(f"could not remove {printable(seg['name'])}: {reason}", file=sys.stderr)
        kept = len(found) - len(gone) - len(failed)
        refused = f", {len(failed)} could not be removed" if failed else ""
        print(f"{len(gone)} removed{refused}, {kept} kept (creator alive)" if found
              else "no PAL-Bench segments in /dev/shm")
        return 1 if failed else 0
    if not found:
        print("no PAL-Bench segments in /dev/shm")
        return 0
    print(f"{'name':<36} {'MB':>9} {'creator pid':>11} {'alive':>5}  kind")
    for seg in found:
        print(f"{printable(seg['name']):<36} {seg['bytes'] / 1e6:>9.1f} {seg['creator_pid']:>11} "
              f"{'yes' if seg['creator_alive'] else 'no':>5}  {seg['kind']}")
    dead = sum(not s["creator_alive"] for s in found)
    if dead:
        print(f"{dead} segment(s) whose creator is gone: `pal-bench shm --clean` removes them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
