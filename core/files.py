"""Output paths that may be local or object-store URLs, all through ``etils.epath``.

Every file the project writes under a workdir (reports, metrics as JSON and JSON lines, plots,
section records, the run lock; checkpoints go to orbax as an ``epath.Path``) is written through
these functions, so that ``--workdir=gs://bucket/run`` works like a local folder: ``gs://``
(``gcsfs``, the ``gcs`` extra), ``s3://`` and the other schemes ``epath`` knows.

Writes are whole-file: on a local file system through a temporary file renamed over the target
(a reader never sees half a file); on an object store as one object upload, which the store makes
visible only once complete. Object stores have no append, so :class:`core.report.JsonLinesWriter`
rewrites its object on each record there.

Paths are ``str`` or ``os.PathLike``; a local path stays relative unless made absolute by
:func:`display`.
"""

from __future__ import annotations

import os
import posixpath
import re
import uuid

from etils import epath

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme(path: str | os.PathLike) -> str | None:
    """The URL scheme of ``path`` (``"gs"`` for ``gs://bucket/x``), or ``None`` for a local path."""
    m = _URL.match(os.fspath(path))
    return m.group(1).lower() if m else None


def is_local(path: str | os.PathLike) -> bool:
    """Whether ``path`` is on the local file system (no URL scheme, or ``file://``)."""
    return scheme(path) in (None, "file")


def as_path(path: str | os.PathLike) -> epath.Path:
    """``path`` as an ``epath.Path`` (``file://`` URLs become plain local paths).

    Raises:
      ValueError: an empty path.
    """
    text = os.fspath(path)
    if not text:
        raise ValueError("empty path; expected a file or folder path or a URL such as gs://b/dir")
    if scheme(text) == "file":
        text = text[len("file://"):]
    return epath.Path(text)


def join(path: str | os.PathLike, *parts: str) -> str:
    """``path/part/...`` as a string; a URL keeps its ``scheme://`` (``os.path.join`` would too on
    POSIX, but not on every platform)."""
    text = os.fspath(path)
    return posixpath.join(text, *parts) if not is_local(text) else os.path.join(text, *parts)


def display(path: str | os.PathLike) -> str:
    """How to show ``path`` to a user: absolute for a local path, the URL unchanged otherwise."""
    text = os.fspath(path)
    if scheme(text) == "file":
        text = text[len("file://"):]
    return os.path.abspath(text) if scheme(text) is None else text


def parent(path: str | os.PathLike) -> str:
    """The folder of ``path`` as :func:`display` shows it (absolute, or a URL)."""
    text = display(path)
    return os.path.dirname(text) if scheme(text) is None else posixpath.dirname(text.rstrip("/"))


def relative(target: str | os.PathLike, start: str | os.PathLike) -> str:
    """``target`` relative to the folder ``start``, with ``/`` separators, as a link in a markdown
    file in ``start`` needs; ``target`` unchanged when the two are not on the same file system (a
    local file and a bucket, or two buckets)."""
    t, s = os.fspath(target), os.fspath(start)
    if is_local(t) and is_local(s):
        rel = os.path.relpath(display(as_path(t)), display(as_path(s)))
        return rel.replace(os.sep, "/")
    if not is_local(t) and not is_local(s):
        (ts, tb, tk), (ss, sb, sk) = _split_url(t), _split_url(s)
        if (ts, tb) == (ss, sb):
            return posixpath.relpath(tk, sk)
    return t


def _split_url(url: str) -> tuple[str, str, str]:
    """``"gs://b/x/y"`` -> ``("gs", "b", "/x/y")``."""
    name, rest = url.split("://", 1)
    bucket, _, key = rest.partition("/")
    return name.lower(), bucket, "/" + key


def missing_client(path: str | os.PathLike, error: ImportError) -> str:
    """The reason, in one line, why ``path`` cannot be reached: its scheme's client library (the
    ``ImportError`` that ``etils.epath`` raised) is not installed; for ``gs://`` it names the
    project's extra that provides it."""
    name = scheme(path)
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    hint = "; for gs:// install the gcs extra: pip install -e '.[gcs]'" if name == "gs" else ""
    return f"no client library for {name}:// paths ({first}){hint}"


def makedirs(path: str | os.PathLike) -> epath.Path:
    """Creates the folder ``path`` and its parents if missing (on an object store, where folders
    are only name prefixes, this may do nothing); returns it as an ``epath.Path``."""
    p = as_path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p


def exists(path: str | os.PathLike) -> bool:
    return as_path(path).exists()


def write_bytes(path: str | os.PathLike, data: bytes) -> str:
    """Writes ``data`` to the file ``path`` (its folder created), whole or not at all: locally a
    temporary file in the same folder renamed over ``path``; on an object store one upload.
    Returns ``path`` as given (a string)."""
    text = os.fspath(path)
    p = as_path(text)
    p.parent.mkdir(parents=True, exist_ok=True)
    if is_local(text):
        tmp = p.parent / f".{p.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            tmp.write_bytes(data)
            os.replace(os.fspath(tmp), os.fspath(p))
        finally:
            if tmp.exists():
                tmp.unlink()
    else:
        p.write_bytes(data)
    return text


def write_text(path: str | os.PathLike, text: str) -> str:
    """:func:`write_bytes` of ``text`` as UTF-8."""
    return write_bytes(path, text.encode("utf-8"))


def read_text(path: str | os.PathLike) -> str:
    """The UTF-8 text of the file ``path``.

    Raises:
      FileNotFoundError: no such file.
    """
    return as_path(path).read_bytes().decode("utf-8")


def remove(path: str | os.PathLike, missing_ok: bool = True) -> None:
    """Removes the file ``path``."""
    as_path(path).unlink(missing_ok=missing_ok)


__all__ = ["as_path", "display", "exists", "is_local", "join", "makedirs", "missing_client", "parent",
           "read_text", "relative", "remove", "scheme", "write_bytes", "write_text"]
