"""What the CLI shows, one way: text through a rich Console that interprets no markup,
no emoji codes and no highlighting, so a value from a file, a server or a user is printed
as it is (`host[:port][/path]` in a refusal, `[red]` in a Hub answer); the styling the
CLI itself adds is a `Text` with a style (`styled`), never markup in a string. Figures
are written through the one output writer (podcommon.atomic_write).
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from k3infra.podcommon import atomic_write


def console(**kwargs: Any):
    """The CLI's Console: literal text (see the module docstring)."""
    # rich here and in styled, not at the top: rich.console takes 0.05 s to import (python
    # -X importtime), and `weights verify` in a pod or a log never prints through it.
    from rich.console import Console

    return Console(markup=False, emoji=False, highlight=False, **kwargs)


def styled(*parts: Any):
    """A line of literal text with styles: styled(("PASS", "green"), ": within...")."""
    from rich.text import Text

    return Text.assemble(*parts)


def write_figure(fig: Any, out: Path) -> Path:
    """A matplotlib figure written to `out` (its format from the suffix) by the one output
    writer: a regular file or a new one in an existing directory, atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format=(Path(out).suffix.lstrip(".") or "png").lower())
    atomic_write(out, buf.getvalue())
    return Path(out)


def pyplot():
    """matplotlib's pyplot on the Agg backend (figures written to files, no display)."""
    # Here, not at the top: matplotlib is optional (the `plot` extra) and takes 0.46 s to
    # import with pyplot (python -X importtime); only --plot draws.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
