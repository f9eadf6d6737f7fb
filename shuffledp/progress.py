"""Progress output for long runs: a tqdm bar on stderr, updated by ``step(stage, count)``.

Progress always goes to stderr, so it shows with ``--json`` too (the JSON document is on stdout).
A run that will take longer than :data:`ANNOUNCE_AFTER` seconds says so early, once: as soon as a
share of the total is done and a second has passed, the time it projects from the rate so far
(:func:`estimate_line`). The projection is the run's own measurement on this machine, under its
current load; stages of different cost make it an order of magnitude, refined by each later ETA."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator

Step = Callable[[str, int], None]

#: A run projected to take longer than this many seconds prints :func:`estimate_line` once.
ANNOUNCE_AFTER = 30.0
#: Seconds of work measured before the projection is trusted enough to print.
_MEASURE_FOR = 1.0


def duration_text(seconds: float) -> str:
    """``seconds`` rounded for a reader: ``45 s``, ``12 min``, ``3.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_line(elapsed: float, share: float) -> str | None:
    """The one line announcing a long run, or None: with ``share`` (0..1) of the work done in
    ``elapsed`` seconds, the whole is projected at ``elapsed / share``; printed when that exceeds
    :data:`ANNOUNCE_AFTER` and at least :data:`_MEASURE_FOR` seconds were measured."""
    if not 0 < share < 1 or elapsed < _MEASURE_FOR:
        return None
    total = elapsed / share
    if total <= ANNOUNCE_AFTER:
        return None
    return (f"this run takes about {duration_text(total)} (projected from the rate of its first "
            f"{100 * share:.2g}%; Ctrl-C stops it)")


class _Announcer:
    """Prints :func:`estimate_line` once, at the first step where it has one."""

    def __init__(self, total: int | None, write: Callable[[str], None]) -> None:
        import time

        self.total, self.write, self.clock = total or 0, write, time.monotonic
        self.started, self.done, self.finished = self.clock(), 0.0, not total  # no total: nothing to project

    def __call__(self, count: int) -> None:
        if self.finished:
            return
        self.done += count
        line = estimate_line(self.clock() - self.started, self.done / self.total)
        if line is not None or self.done >= self.total:
            self.finished = True
        if line is not None:
            self.write(line)


@contextlib.contextmanager
def progress_bar(total: int | None, *, quiet: bool = False, unit: str = "user") -> Iterator[Step | None]:
    """Yield a ``step(stage, count)`` callback (or None when quiet) driving one bar (``total`` None: a counter).

    When stderr is not a terminal no bar is drawn: a line is written at each new stage and each tenth
    of the total, with the count, the share and an ETA."""
    if quiet:
        yield None
        return
    if not _is_terminal(sys.stderr):
        yield _plain_lines(total, unit)
        return
    from tqdm import tqdm

    with tqdm(total=total, unit=unit, unit_scale=True, file=sys.stderr, mininterval=0.5) as bar:
        announce = _Announcer(total, lambda line: bar.write(line, file=sys.stderr))

        def step(stage: str, count: int) -> None:
            bar.set_description(stage, refresh=count == 0)  # a new stage with no units yet shows at once
            bar.update(count)
            announce(count)

        yield step


def _plain_lines(total: int | None, unit: str) -> Step:
    """Progress for a stream that is not a terminal (a log, a pipe, CI): no bar redrawn in place, but
    one line at each new stage and at each tenth of ``total``, with the count, the share and an ETA
    (a ``"%"`` unit, a total of 100, prints the share alone)."""
    import time

    started = time.monotonic()
    state: dict[str, Any] = {"stage": None, "done": 0.0, "tenth": 0}
    announce = _Announcer(total, lambda line: print(line, file=sys.stderr, flush=True))

    def report(stage: str) -> None:
        done = state["done"]
        if total:
            share = min(1.0, done / total)
            elapsed = time.monotonic() - started
            eta = f", ETA {elapsed * (1 - share) / share:.0f} s" if 0 < share < 1 else ""
            count = f"{100 * share:.0f}%" if unit == "%" else f"{done:,.0f}/{total:,} {unit}s ({100 * share:.0f}%)"
            print(f"{stage}: {count}{eta}", file=sys.stderr, flush=True)
        else:
            print(f"{stage}: {done:,.0f}{unit if unit == '%' else ' ' + unit + 's'}", file=sys.stderr, flush=True)

    def step(stage: str, count: int) -> None:
        state["done"] += count
        announce(count)
        tenth = int(10 * state["done"] / total) if total else 0
        if stage != state["stage"] or tenth > state["tenth"]:
            state["stage"], state["tenth"] = stage, tenth
            report(stage)

    return step


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def save_figure(fig, path: str) -> None:
    """Lay out, write and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
