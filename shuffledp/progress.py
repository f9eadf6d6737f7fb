"""Progress output for long runs: a tqdm bar on stderr, updated by ``step(stage, count)``."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

Step = Callable[[str, int], None]


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

        def step(stage: str, count: int) -> None:
            bar.set_description(stage, refresh=count == 0)  # a new stage with no units yet shows at once
            bar.update(count)

        yield step


def _plain_lines(total: int | None, unit: str) -> Step:
    """Progress for a stream that is not a terminal (a log, a pipe, CI): no bar redrawn in place, but
    one line at each new stage and at each tenth of ``total``, with the count, the share and an ETA
    (a ``"%"`` unit, a total of 100, prints the share alone)."""
    import time

    started = time.monotonic()
    state = {"stage": None, "done": 0.0, "tenth": 0}

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
