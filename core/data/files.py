"""Reading a data file as text, with one clear error for every way that can fail.

Every reader of user-supplied files (time series, judgement files, prompt and text files) goes
through :func:`read_text`, so a directory, an unreadable or missing file, a corrupt or mislabelled
gzip file and text that is not UTF-8 all give one ``ValueError`` (or ``FileNotFoundError``) naming
the file, and for a decoding error its line, before any other work. A path may be local or an
object-store URL (``gs://bucket/data.csv``; read through :mod:`core.files`).
"""

from __future__ import annotations

import gzip
import os
import zlib

from core import files

GZIP_MAGIC = b"\x1f\x8b"


def check_file(path: str, what: str = "data file") -> str:
    """Returns ``path`` if it is an existing, readable regular file.

    Raises:
      FileNotFoundError: nothing at ``path``.
      ValueError: ``path`` is a directory (or another non-file), or it cannot be read.
    """
    if not files.is_local(path):
        p = files.as_path(path)
        try:
            found, folder = p.exists(), p.is_dir()
        except ImportError as e:
            raise ValueError(f"{what} {path!r}: {files.missing_client(path, e)}") from None
        if not found:
            raise FileNotFoundError(f"{what} {path!r} does not exist")
        if folder:
            raise ValueError(f"{what} {path!r} is a directory; expected a file")
        return path
    local = files.display(path)
    if not os.path.exists(local):
        raise FileNotFoundError(f"{what} {path!r} does not exist")
    if os.path.isdir(local):
        raise ValueError(f"{what} {path!r} is a directory; expected a file")
    if not os.path.isfile(local):
        raise ValueError(f"{what} {path!r} is not a regular file")
    if not os.access(local, os.R_OK):
        raise ValueError(f"{what} {path!r} is not readable (permission denied)")
    return path


def read_bytes(path: str, what: str = "data file") -> bytes:
    """The file's bytes, decompressed when it is gzip (recognised by its magic bytes, whatever its
    extension).

    Raises:
      FileNotFoundError, ValueError: as :func:`check_file`; a ``.gz`` file that is not gzip, or a
        corrupt or truncated gzip stream.
    """
    check_file(path, what)
    try:
        raw = files.as_path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{what} {path!r} cannot be read ({e.strerror or e})") from None
    if raw[:2] == GZIP_MAGIC:
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"{what} {path!r} is a corrupt or truncated gzip file ({e})") from None
    if path.lower().endswith(".gz"):
        raise ValueError(f"{what} {path!r} ends in .gz but is not a gzip file")
    return raw


def read_text(path: str, what: str = "data file") -> str:
    """The file's text (UTF-8, a BOM dropped; gzip decompressed as in :func:`read_bytes`).

    Raises:
      FileNotFoundError, ValueError: as :func:`read_bytes`; bytes that are not UTF-8 (the message
        names the line and column of the first bad byte).
    """
    raw = read_bytes(path, what)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ValueError(f"{what} {path!r}, line {line}, column {column}: not UTF-8 text "
                         f"(byte 0x{raw[e.start]:02x})") from None


__all__ = ["check_file", "read_bytes", "read_text"]
