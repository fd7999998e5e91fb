"""The papers' public data sets by name: download once, verify, cache.

``fetch("etth1")`` returns the path of a local copy of ETTh1.csv. On first use the file is
downloaded from its canonical source (:data:`DATASETS`: a URL and a SHA-256 per name) into the
cache folder (:func:`cache_dir`): ``$XDG_CACHE_HOME/icml26-jax/`` or ``~/.cache/icml26-jax/``, or
the ``data_dir`` given. Later calls find the file there and make no request. The download

- shows a tqdm progress bar (bytes);
- is written to ``<file>.part`` and resumed from its end (HTTP ``Range``) after a dropped
  connection, within the call and in a later call;
- is checked against the pinned SHA-256 before it is renamed (atomically) to its final name, so
  the final name only ever holds a verified file; a mismatch removes the bad ``.part`` and keeps
  any good copy;
- fails with one :class:`DataUnavailableError` line naming the URL, the reason and the file to
  place by hand (and where) when the source cannot be reached (offline, an HTTP error).

A file placed by hand at the cached path (same file name) is used as is once its checksum
matches. The pins were computed from copies of the files, not from a download of these URLs here;
a source that changes its file breaks the pin, and the error says so (expected and actual
SHA-256).

Only the standard library does the transfer (``urllib``); the cache folder is local.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import os
import socket
import urllib.error
import urllib.request

PROJECT = "icml26-jax"
CHUNK_BYTES = 1 << 16
DEFAULT_TIMEOUT_S = 30.0
# Attempts per call; each after the first resumes from the end of the ``.part`` file.
ATTEMPTS = 3


class DataUnavailableError(RuntimeError):
    """A data set could not be downloaded (unreachable source, HTTP error, a transfer that kept
    breaking off). The message is one line: the URL, the reason, and where to place the file by
    hand."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    """One downloadable data file.

    Attributes:
      name: the registry key (lower case), e.g. ``"etth1"``.
      url: the canonical source of the file (HTTP or HTTPS).
      sha256: hex SHA-256 of the file's bytes as downloaded (a gzip file is pinned compressed).
      filename: the file's name in the cache folder (readers infer the format from the content,
        and the reports name a data set after this file name without extension).
      size: the file's length in bytes (the progress bar's total when the server sends none).
      format: what the bytes are: ``"csv"`` (a header row) or ``"csv.gz"`` (gzip of headerless
        comma-separated rows).
      source: the repository and path the URL points into, for humans.
      licence: the licence the source states.
    """

    name: str
    url: str
    sha256: str
    filename: str
    size: int
    format: str
    source: str
    licence: str


# Pinned from copies of the files; the URLs were not reachable where the pins were computed, so
# the pins are unverified against the sources (a mismatch is reported, never accepted).
DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset("etth1",
            "https://raw.githubusercontent.com/zhouhaoyi/ETDataset/main/ETT-small/ETTh1.csv",
            "f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066", "ETTh1.csv",
            2_589_657, "csv", "github.com/zhouhaoyi/ETDataset, ETT-small/ETTh1.csv",
            "CC BY-ND 4.0"),
    Dataset("etth2",
            "https://raw.githubusercontent.com/zhouhaoyi/ETDataset/main/ETT-small/ETTh2.csv",
            "a3dc2c597b9218c7ce1cd55eb77b283fd459a1d09d753063f944967dd6b9218b", "ETTh2.csv",
            2_417_960, "csv", "github.com/zhouhaoyi/ETDataset, ETT-small/ETTh2.csv",
            "CC BY-ND 4.0"),
    Dataset("exchange_rate",
            "https://raw.githubusercontent.com/laiguokun/multivariate-time-series-data/master/"
            "exchange_rate/exchange_rate.txt.gz",
            "6a4fbb561dcdee43f071a83badbeec9223a335552278348656738b556f1c2e9d",
            "exchange_rate.txt.gz", 177_142, "csv.gz",
            "github.com/laiguokun/multivariate-time-series-data, exchange_rate/exchange_rate.txt.gz",
            "as published there"),
    Dataset("llmfao",
            "https://raw.githubusercontent.com/dustalov/evalica/master/llmfao.csv",
            "106564a4bf06f047a4662979384313c22d9b4ca901e780f9e8419f8e5581adb1", "llmfao.csv",
            498_018, "csv", "github.com/dustalov/evalica, llmfao.csv", "Apache-2.0"),
)}


def dataset(name: str) -> Dataset:
    """The registry entry of ``name`` (case-insensitive).

    Raises:
      ValueError: an unknown name (the message lists the known ones).
    """
    key = name.strip().lower()
    if key not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; expected one of {', '.join(DATASETS)}")
    return DATASETS[key]


def cache_dir(data_dir: str | os.PathLike | None = None) -> str:
    """The local folder that holds downloaded files: ``data_dir`` when given (not empty), else
    ``$XDG_CACHE_HOME/icml26-jax`` when that variable is set, else ``~/.cache/icml26-jax``.
    Nothing is created here.

    Raises:
      ValueError: ``data_dir`` is a URL (``gs://...``): the cache is a local folder.
    """
    if data_dir:
        text = os.fspath(data_dir)
        if "://" in text and not text.startswith("file://"):
            raise ValueError(f"data_dir {text!r}: expected a local folder (downloads resume in "
                             "place), not a URL")
        return os.path.abspath(os.path.expanduser(text.removeprefix("file://")))
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(root), PROJECT)


def cached_path(name: str | Dataset, data_dir: str | os.PathLike | None = None) -> str:
    """Where ``name``'s file is (or will be) cached; the file may not exist."""
    d = name if isinstance(name, Dataset) else dataset(name)
    return os.path.join(cache_dir(data_dir), d.filename)


def sha256_of(path: str) -> str:
    """Hex SHA-256 of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def how_to_get(name: str | Dataset, data_dir: str | os.PathLike | None = None) -> str:
    """One sentence: how to put ``name``'s file in the cache (download it, or place it by hand)."""
    d = name if isinstance(name, Dataset) else dataset(name)
    return (f"download {d.url} and place it at {cached_path(d, data_dir)} (sha256 {d.sha256}), "
            f"or run `python -m core.data.download {d.name}` where the source is reachable")


def is_cached(name: str | Dataset, data_dir: str | os.PathLike | None = None) -> bool:
    """Whether ``name``'s file is in the cache with the pinned checksum."""
    path = cached_path(name, data_dir)
    d = name if isinstance(name, Dataset) else dataset(name)
    return os.path.isfile(path) and sha256_of(path) == d.sha256


def fetch(name: str | Dataset, data_dir: str | os.PathLike | None = None, *,
          timeout: float = DEFAULT_TIMEOUT_S, progress: bool = True) -> str:
    """The local path of data set ``name``'s file, downloaded into the cache on first use.

    Args:
      name: a key of :data:`DATASETS` (``"etth1"``, ``"etth2"``, ``"exchange_rate"``,
        ``"llmfao"``; case-insensitive) or a :class:`Dataset`.
      data_dir: the cache folder (:func:`cache_dir`); created when missing.
      timeout: seconds to wait for the connection and for each read (a short one makes an
        offline attempt end quickly).
      progress: show a tqdm progress bar while downloading.

    Returns:
      The absolute path of the verified file (``<cache>/<filename>``).

    Raises:
      ValueError: an unknown name; a cache folder that cannot be created, or a directory at the
        file's place; a cached or hand-placed file, or a completed download, whose
        SHA-256 differs from the pin (the message gives both; a bad download is removed, a file
        already at the final name is left for the user to inspect or delete).
      DataUnavailableError: the source cannot be reached or answers with an HTTP error, or the
        transfer broke off :data:`ATTEMPTS` times (the ``.part`` file is kept for the next call
        to resume).
    """
    d = name if isinstance(name, Dataset) else dataset(name)
    final = cached_path(d, data_dir)
    if os.path.exists(final):
        if not os.path.isfile(final):
            raise ValueError(f"data set {d.name}: {final} is not a regular file; expected "
                             f"{d.filename} there")
        got = sha256_of(final)
        if got != d.sha256:
            raise ValueError(f"data set {d.name}: {final} has sha256 {got}, expected {d.sha256}; "
                             f"delete it to download {d.url} again, or place the right file there")
        return final
    try:
        os.makedirs(os.path.dirname(final), exist_ok=True)
    except OSError as e:
        raise ValueError(f"data set {d.name}: cannot create the cache folder "
                         f"{os.path.dirname(final)} ({e.strerror or e}); choose another with "
                         "data_dir or XDG_CACHE_HOME") from None
    part = final + ".part"
    for _ in range(ATTEMPTS):
        try:
            complete = _transfer(d, part, timeout, progress)
        except _Unreachable as e:
            raise DataUnavailableError(
                f"data set {d.name}: cannot download {d.url} ({e}); {_place_by_hand(d, final)}"
            ) from None
        if complete:
            break
    else:
        raise DataUnavailableError(
            f"data set {d.name}: the download of {d.url} broke off {ATTEMPTS} times (partial file "
            f"kept at {part}; a later call resumes it); {_place_by_hand(d, final)}")
    got = sha256_of(part)
    if got != d.sha256:
        os.remove(part)
        raise ValueError(f"data set {d.name}: the file downloaded from {d.url} has sha256 {got}, "
                         f"expected {d.sha256}; removed it (the source may have changed the file)")
    os.replace(part, final)
    if progress:
        print(f"data set {d.name}: downloaded {d.url} to {final} (sha256 verified)", flush=True)
    return final


def fetch_if_reachable(name: str | Dataset, data_dir: str | os.PathLike | None = None, *,
                       timeout: float = 10.0, progress: bool = True) -> tuple[str | None, str]:
    """:func:`fetch` for an optional measurement: ``(path, "")`` when the file is cached or
    downloads (an attempt that cannot connect ends within about ``timeout`` seconds), else
    ``(None, how_to_get(name))`` after printing the one-line reason.

    Raises:
      ValueError: as :func:`fetch` (an unknown name, a checksum mismatch): a wrong file is an
        error, not a missing one.
    """
    try:
        return fetch(name, data_dir, timeout=timeout, progress=progress), ""
    except DataUnavailableError as e:
        print(f"not measured here: {e}", flush=True)
        return None, how_to_get(name, data_dir)


def _place_by_hand(d: Dataset, final: str) -> str:
    return f"to use it offline, download that file elsewhere and place it at {final}"


class _Unreachable(Exception):
    """The source did not answer usefully (no connection, HTTP error): retrying will not help."""


def _transfer(d: Dataset, part: str, timeout: float, progress: bool) -> bool:
    """Appends the rest of ``d``'s file to ``part`` (from its current length, by HTTP ``Range``;
    from the start when the server ignores the range). Returns whether the transfer reached the
    end of the file (False: the connection broke off; ``part`` keeps what arrived).

    Raises:
      _Unreachable: no connection, a timeout before any byte, or an HTTP error status.
    """
    from tqdm.auto import tqdm

    have = os.path.getsize(part) if os.path.exists(part) else 0
    request = urllib.request.Request(d.url, headers={"User-Agent": f"{PROJECT} data download"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # the range starts at or past the end: the file is complete
            e.close()
            return True
        e.close()
        raise _Unreachable(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise _Unreachable(_reason(e.reason)) from None
    except (OSError, http.client.HTTPException) as e:
        raise _Unreachable(_reason(e)) from None
    with response:
        status = getattr(response, "status", 200)
        if have and status != 206:  # the server sent the whole file: start over
            have = 0
        length = response.headers.get("Content-Length")
        expected = have + int(length) if length and length.isdigit() else None
        total = expected if expected is not None else d.size
        received = have
        with open(part, "ab" if have else "wb") as f, tqdm(
                total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                desc=f"download {d.filename}", disable=not progress, leave=False,
                mininterval=1.0) as bar:
            while True:
                try:
                    block = response.read(CHUNK_BYTES)
                except (OSError, http.client.HTTPException):
                    return False  # broke off mid-transfer (reset, timeout, incomplete read)
                if not block:
                    break
                f.write(block)
                received += len(block)
                bar.update(len(block))
    return expected is None or received >= expected


def _reason(e) -> str:
    """A short reason for a failed connection (``e``: an exception or a string)."""
    if isinstance(e, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(e, socket.gaierror):
        return f"host not found, offline? ({e.strerror or e})"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """``python -m core.data.download [NAME ...] [--data_dir=DIR]``: downloads the named data sets
    (all when none is named) and prints each one's path; with ``--list``, prints the registry and
    what is cached."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m core.data.download",
                                     description="Download the papers' data sets into the cache.")
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(DATASETS)} (default: all)")
    parser.add_argument("--data_dir", default="", help=f"cache folder (default {cache_dir()})")
    parser.add_argument("--list", action="store_true", help="list the data sets and the cache")
    args = parser.parse_args(argv)
    try:
        names = [dataset(n).name for n in args.names] or list(DATASETS)
        if args.list:
            for n in names:
                d = DATASETS[n]
                state = "cached" if is_cached(d, args.data_dir) else "not cached"
                print(f"{n}: {cached_path(d, args.data_dir)} ({state}); {d.url}; {d.licence}")
            return 0
        for n in names:
            print(f"{n}: {fetch(n, args.data_dir)}")
    except (ValueError, DataUnavailableError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


__all__ = ["ATTEMPTS", "DATASETS", "DataUnavailableError", "Dataset", "cache_dir", "cached_path",
           "dataset", "fetch", "fetch_if_reachable", "how_to_get", "is_cached", "sha256_of"]

if __name__ == "__main__":
    raise SystemExit(main())
