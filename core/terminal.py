"""Plain output for logs and pipes: where stdout/stderr are not a terminal, progress bars (tqdm)
become periodic plain lines and other text starts on a line of its own."""

from __future__ import annotations

import io
import math
import re
import sys
import threading
import time
from collections.abc import Callable

_ANSI_CODE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BAR_GRAPHIC = re.compile(r"\|[^|]*\|")


class PlainLines(io.TextIOBase):
    """A text stream that passes only whole, plain lines to ``stream`` (a log file or pipe).

    Progress bars (tqdm) redraw one line with carriage returns and move the cursor with escape
    codes; in a log those become one ever-growing line onto which the next error is glued. Here a
    carriage-return update is held back and written as its own line (bar graphic removed) at most
    once per ``interval_s`` for each bar (keyed by its label, so the first update of a label is
    shown at once); escape codes and the newlines that move the cursor between nested bars are dropped;
    any other text is passed through at once, starting on a fresh line.

    Args:
      stream: the underlying text stream.
      interval_s: seconds between two lines of the same bar.
      clock: the time source (monotonic seconds).
    """

    def __init__(self, stream, interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.stream, self.interval_s, self._clock = stream, interval_s, clock
        self._lock = threading.RLock()
        self._in_status = False  # the last write was a carriage-return update
        self._status, self._shown = "", False
        self._after_status = False  # a bar was drawn since the last line of other text
        self._open = False  # the underlying stream's current line has text but no newline yet
        self._last: dict[str, float] = {}

    # io attributes that callers look for on sys.stdout / sys.stderr
    encoding = property(lambda self: getattr(self.stream, "encoding", "utf-8"))
    errors = property(lambda self: getattr(self.stream, "errors", "strict"))
    buffer = property(lambda self: self.stream.buffer)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()

    def flush(self) -> None:
        with self._lock:
            self.stream.flush()

    def write(self, text: str) -> int:
        with self._lock:
            clean = _ANSI_CODE.sub("", text)
            if self._in_status and not clean.startswith("\r"):
                self._in_status = False  # that update was shown or skipped at its write
            if clean and not clean.strip("\n") and self._after_status and not self._open:
                return len(text)  # a bar moving the cursor down to its row: no blank line here
            for token in re.split(r"(\r|\n)", clean):
                if token == "\r":
                    if self._in_status and self._status:  # an update made within this write
                        self._show_status()
                    self._in_status, self._status, self._shown = True, "", False
                    self._after_status = True
                elif token == "\n" and self._in_status:
                    self._show_status()
                    self._in_status = False
                elif self._in_status:
                    self._status += token
                elif token:
                    self.stream.write(token)
                    self._open = not token.endswith("\n")
                    self._after_status = self._after_status and not token.strip()
            if self._in_status:  # one update per write: show it if its bar's interval is up
                self._show_status()
                self._status = ""  # considered once, at the write that made it
        return len(text)

    def _show_status(self) -> None:
        """Writes the current bar state as a line, unless already written or the same bar
        (keyed by its label) had a line less than ``interval_s`` ago."""
        line = " ".join(_BAR_GRAPHIC.sub(" ", self._status).split())
        if not line or self._shown:
            return
        key = line.split(":", 1)[0] if ":" in line else ""
        now = self._clock()
        if now - self._last.get(key, -math.inf) < self.interval_s:
            return
        self._last[key], self._shown = now, True
        self.stream.write(("\n" if self._open else "") + line + "\n")
        self._open = False
        self.stream.flush()


def plain_output_if_not_tty(interval_s: float = 30.0) -> None:
    """Wraps ``sys.stdout`` and ``sys.stderr`` in :class:`PlainLines` where they are not a
    terminal (a log file, a pipe to the main job), so that progress bars become periodic plain
    lines there; a terminal keeps its live bars."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, PlainLines):
            continue
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if not tty:
            setattr(sys, name, PlainLines(stream, interval_s))
