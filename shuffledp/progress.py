"""Progress output for long runs: a tqdm bar on stderr, updated by ``step(stage, count)``."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

Step = Callable[[str, int], None]


@contextlib.contextmanager
def progress_bar(total: int | None, *, quiet: bool = False, unit: str = "user") -> Iterator[Step | None]:
    """Yield a ``step(stage, count)`` callback (or None when quiet) driving one bar (``total`` None: a counter)."""
    if quiet:
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit=unit, unit_scale=True, file=sys.stderr, mininterval=0.5) as bar:

        def step(stage: str, count: int) -> None:
            bar.set_description(stage, refresh=count == 0)  # a new stage with no units yet shows at once
            bar.update(count)

        yield step


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
