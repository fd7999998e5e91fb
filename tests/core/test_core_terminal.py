"""core.terminal: progress bars in logs: where output is not a terminal, a tqdm bar becomes plain
periodic lines (no carriage returns, no cursor codes), and an error printed after a bar starts its
own line."""

import io
import subprocess
import sys
import textwrap

from tqdm import tqdm

from core.terminal import PlainLines


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _plain(interval_s=10.0):
    clock = Clock()
    return PlainLines(io.StringIO(), interval_s=interval_s, clock=clock), clock


def _bar(stream, total, **kw):
    # mininterval=0, miniters=1: tqdm redraws on every update, the worst case for a log
    return tqdm(total=total, file=stream, mininterval=0, miniters=1, ascii=False, **kw)


def test_bar_becomes_one_plain_line_per_interval(capsys):
    stream, clock = _plain(interval_s=10.0)
    bar = _bar(stream, 100, desc="train", leave=False)
    for _ in range(100):
        clock.t += 1.0
        bar.update(1)
    bar.close()
    text = stream.stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert all(line.startswith("train:") for line in lines), lines
    assert all("|" not in line for line in lines)  # the bar graphic is dropped
    # 100 s of updates at one line per 10 s: the first state, then one every 10 s
    assert 10 <= len(lines) <= 11, lines
    assert lines[0].startswith("train: 0%") and "/100" in lines[-1]


def test_a_bar_that_is_left_adds_no_blank_line():
    stream, clock = _plain(interval_s=2.0)
    bar = _bar(stream, 5, desc="eval", leave=True)
    for _ in range(5):
        clock.t += 1.0
        bar.update(1)
    bar.close()
    stream.write("next\n")
    lines = stream.stream.getvalue().splitlines()
    # t = 0 (first state), 2, 4: every 2 s; the closing newline adds nothing
    assert [line.split("%")[0] for line in lines[:-1]] == ["eval: 0", "eval: 40", "eval: 80"]
    assert lines[-1] == "next"


def test_error_after_a_bar_is_on_its_own_line():
    stream, clock = _plain()
    bar = _bar(stream, 10, desc="train", leave=False)
    bar.update(3)
    print("Traceback (most recent call last):", file=stream)
    print("ValueError: boom", file=stream)
    bar.close()
    lines = stream.stream.getvalue().splitlines()
    assert lines[-2:] == ["Traceback (most recent call last):", "ValueError: boom"], lines
    assert all(line.startswith("train:") for line in lines[:-2])


def test_nested_bars_leave_no_cursor_codes():
    stream, clock = _plain(interval_s=0.0)
    outer = _bar(stream, 3, desc="outer", position=0, leave=False)
    for _ in range(3):
        inner = _bar(stream, 4, desc="inner", position=1, leave=False)
        for _ in range(4):
            clock.t += 1
            inner.update(1)
        inner.close()
        outer.update(1)
    outer.close()
    text = stream.stream.getvalue()
    assert "\x1b" not in text and "\r" not in text
    keys = [line.split(":")[0] for line in text.splitlines()]
    assert set(keys) == {"outer", "inner"}, text  # and no blank lines
    assert keys.count("inner") >= 3 * 4


def test_plain_text_passes_through_unchanged():
    stream, _ = _plain()
    stream.write("abc")
    stream.write("def\nghi\n")
    stream.write("")
    assert stream.stream.getvalue() == "abcdef\nghi\n"
    assert not stream.isatty()


def test_an_entry_point_with_piped_output_prints_plain_lines():
    # An interval longer than any run: the bar's first state is its one line, however slowly the
    # loop runs (how often lines come is tested above, on a clock the test moves).
    code = textwrap.dedent("""
        import sys
        from tqdm import tqdm
        from core.terminal import plain_output_if_not_tty
        plain_output_if_not_tty(interval_s=1e9)
        for _ in tqdm(range(20), desc="work", mininterval=0, miniters=1):
            pass
        print("error: something", file=sys.stderr)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("work: 0% 0/20 [") and \
        lines[1] == "error: something", lines
