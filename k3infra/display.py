"""What the CLI shows, one way: text through a rich Console that interprets no markup,
no emoji codes and no highlighting, so a value from a file, a server or a user is printed
as it is (`host[:port][/path]` in a refusal, `[red]` in a Hub answer); the styling the
CLI itself adds is a `Text` with a style (`styled`), never markup in a string. Figures
are written through the one output writer (podcommon.atomic_write).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


def console(**kwargs: Any):
    """The CLI's Console: literal text (see the module docstring)."""
    from rich.console import Console

    return Console(markup=False, emoji=False, highlight=False, **kwargs)


def styled(*parts: Any):
    """A line of literal text with styles: styled(("PASS", "green"), ": within...")."""
    from rich.text import Text

    return Text.assemble(*parts)


def write_figure(fig: Any, out: Path) -> Path:
    """A matplotlib figure written to `out` (its format from the suffix) by the one output
    writer: a regular file or a new one in an existing directory, atomically."""
    import io

    from k3infra.podcommon import atomic_write

    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format=(Path(out).suffix.lstrip(".") or "png").lower())
    atomic_write(out, buf.getvalue())
    return Path(out)
