"""Running a child process under a watch for progress: its output lines are forwarded, and it is
stopped as hung after a time without an output line or a file written in the folders it works in
(not after a fixed total time, unless a cap is given)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from core import files as paths
from core import timing


class _Watched:
    """A child process whose stdout/stderr lines are forwarded to ours; ``last_output`` is the
    ``clock()`` time of its last line (of its start, before the first line)."""

    def __init__(self, cmd: list[str], clock: Callable[[], float]):
        self._clock = clock
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, errors="replace", bufsize=1)
        self.last_output = clock()
        self.quiet = False  # set after Ctrl-C: the job prints its own one line
        self._pumps = [threading.Thread(target=self._pump, args=(pipe, sink), daemon=True)
                       for pipe, sink in ((self.proc.stdout, "stdout"),
                                          (self.proc.stderr, "stderr"))]
        for t in self._pumps:
            t.start()

    def _pump(self, pipe, sink: str) -> None:
        for line in iter(pipe.readline, ""):
            self.last_output = self._clock()  # before forwarding: a forwarded line is progress
            if not self.quiet:
                stream = getattr(sys, sink)
                stream.write(line)
                stream.flush()
        pipe.close()

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 30.0) -> None:
        """Sends ``sig``, waits up to ``grace_s`` for the child to exit, then kills it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.join()

    def join(self) -> None:
        for t in self._pumps:
            t.join(timeout=5)


def _files_state(directory: str) -> tuple[int, int, int]:
    """A fingerprint of everything under ``directory`` (itself included): (newest modification
    time in ns, number of entries, total bytes). A file created, removed, grown or shrunk changes
    it, and so does any write in a later tick of the file system's clock. Only a change is used,
    never the times themselves, so the watcher's clock need not be the file system's."""
    newest = count = size = 0
    for root, _dirs, files in os.walk(directory):
        for entry in [root, *(os.path.join(root, f) for f in files)]:
            with contextlib.suppress(OSError):
                st = os.stat(entry)
                newest, count, size = max(newest, st.st_mtime_ns), count + 1, size + st.st_size
    return newest, count, size


def watch(cmd: list[str], watch_dir: str | Sequence[str], stall_s: float,
          timeout_s: float | None = None, poll_s: float = 1.0, *,
          clock: Callable[[], float] = timing.now,
          sleep: Callable[[float], None] = time.sleep) -> tuple[str, int | None, float]:
    """Runs ``cmd``, forwarding its output, until it exits or stops making progress.

    Progress is an output line (stdout or stderr) or a change to the files under one of the local
    folders ``watch_dir`` (looked for every ``min(10 s, stall_s / 4)``); folders in an object
    store (``gs://``) are not listed (a listing every few seconds is slow and billed), so there
    only output lines count: a long step must print, as progress bars do at least every 30 s when
    the output is not a terminal. A process with neither for more than
    ``stall_s`` seconds, its start-up included, is stopped (SIGTERM, then SIGKILL after 30 s).
    The total time is not limited unless ``timeout_s`` is given. Ctrl-C is passed on to the child
    as SIGINT (so that a checkpoint being saved is committed), and re-raised once it has exited.

    Args:
      cmd: the child's command line.
      watch_dir: the folder, or folders, whose files count as the child's progress (need not
        exist yet; object-store URLs are ignored).
      stall_s: seconds without progress after which the child is stopped as hung.
      timeout_s: optional cap on the child's total seconds.
      poll_s: seconds between two checks (the ``sleep`` between them).
      clock: the time source, monotonic seconds (default :func:`core.timing.now`); every time
        above is measured on it, so a test can run the watcher on a clock it controls.
      sleep: waits between two checks; called with ``poll_s``.

    Returns:
      ``(outcome, exit code, seconds without progress)``; ``outcome`` is ``"exited"``,
      ``"stalled"`` or ``"timed out"``.
    """
    folders = [d for d in ([watch_dir] if isinstance(watch_dir, str) else watch_dir)
               if paths.is_local(d)]

    def files_state():
        return [_files_state(paths.display(d)) for d in folders]

    child = _Watched(cmd, clock)
    start = scanned = last_write = child.last_output
    files = files_state()
    scan_s = min(10.0, stall_s / 4)
    try:
        while child.proc.poll() is None:
            sleep(poll_s)
            now = clock()
            if folders and now - scanned >= scan_s:
                scanned, seen = now, files_state()
                if seen != files:
                    files, last_write = seen, now
            silent = now - max(child.last_output, last_write)
            if timeout_s is not None and now - start > timeout_s:
                child.stop()
                return "timed out", child.proc.returncode, silent
            if silent > stall_s:
                child.stop()
                return "stalled", child.proc.returncode, silent
    except KeyboardInterrupt:
        child.quiet = True
        child.stop(signal.SIGINT)
        raise
    child.join()
    return "exited", child.proc.returncode, 0.0
