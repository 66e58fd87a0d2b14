"""The harness of the hostile-input tests (issues 28 and 48): a hang fails the example
through an alarm (the harness's bound, never an assertion on speed), and a refusal is one
line with no traceback."""
from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def bounded(seconds: int = 20):
    """A hang fails the example (SIGALRM), not a speed check."""
    def expired(_sig, _frame):
        raise TimeoutError(f"no answer in {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def one_line(text: str) -> str:
    """`text` is one line, without a traceback."""
    assert "Traceback" not in text, text
    assert len(text.strip().splitlines()) <= 1, text
    return text


def cli(capsys, *argv, seconds: int = 120) -> tuple[int, str]:
    """`k3infra ARGV` in this process: (exit status, everything it printed), under the
    alarm; argparse's own refusal is its exit 2; never a traceback."""
    from k3infra.cli import main

    with bounded(seconds):
        try:
            rc = main(list(argv))
        except SystemExit as exc:
            rc = exc.code
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text, text
    return rc, text
