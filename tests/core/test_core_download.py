"""core.data.download against a loopback HTTP server that the tests control
(:class:`core.testing.LoopbackFileServer`): a first download and
a cache hit, resuming a broken transfer with HTTP Range, a server that ignores the range, a
checksum mismatch, an HTTP error and a closed port (offline). The registry's pins are checked
against the benchmark copies beside the checkout when that folder exists."""

import hashlib
import os

import numpy as np
import pytest

from core.data import download
from core.data.download import Dataset, DataUnavailableError
from core.testing import LoopbackFileServer, closed_port_url

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")


def _body(n: int = 200_003, seed: int | None = None) -> bytes:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def _entry(url: str, body: bytes, sha: str | None = None, filename: str = "series.csv") -> Dataset:
    return Dataset(name="test", url=url, sha256=sha or hashlib.sha256(body).hexdigest(),
                   filename=filename, size=len(body), format="csv", source="loopback",
                   licence="none")


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_download_then_cache_hit_without_a_request(tmp_path):
    body = _body()
    with LoopbackFileServer(body) as s:
        d = _entry(s.url("series.csv"), body)
        path = download.fetch(d, tmp_path, progress=False)
        assert path == os.path.join(str(tmp_path), "series.csv")
        assert open(path, "rb").read() == body
        assert s.requests == [None]
        assert not os.path.exists(path + ".part")
        assert download.is_cached(d, tmp_path)
        assert download.fetch(d, tmp_path, progress=False) == path
        assert s.requests == [None]  # the second call made no request


def test_broken_transfer_resumes_with_range_in_the_same_call(tmp_path):
    body = _body()
    cut = 70_001
    with LoopbackFileServer(body, mode="truncate", cut=cut, cuts=1) as s:
        path = download.fetch(_entry(s.url("x"), body), tmp_path, progress=False)
        assert open(path, "rb").read() == body
        assert s.requests == [None, f"bytes={cut}-"]


def test_partial_file_of_an_earlier_call_is_resumed(tmp_path):
    body = _body()
    have = 123_457
    (tmp_path / "series.csv.part").write_bytes(body[:have])
    with LoopbackFileServer(body) as s:
        path = download.fetch(_entry(s.url("x"), body), tmp_path, progress=False)
        assert open(path, "rb").read() == body
        assert s.requests == [f"bytes={have}-"]


def test_complete_partial_file_is_verified_and_renamed(tmp_path):
    body = _body(5000)
    (tmp_path / "series.csv.part").write_bytes(body)
    with LoopbackFileServer(body) as s:  # the range starts at the end: 416, the file is complete
        path = download.fetch(_entry(s.url("x"), body), tmp_path, progress=False)
        assert open(path, "rb").read() == body and s.requests == ["bytes=5000-"]


def test_server_that_ignores_range_restarts_the_file(tmp_path):
    body = _body()
    (tmp_path / "series.csv.part").write_bytes(b"stale bytes of another file" * 100)
    with LoopbackFileServer(body, mode="ignore_range") as s:
        path = download.fetch(_entry(s.url("x"), body), tmp_path, progress=False)
        assert open(path, "rb").read() == body


def test_transfer_that_keeps_breaking_keeps_the_part_for_a_later_call(tmp_path):
    body = _body()
    with LoopbackFileServer(body, mode="truncate", cut=10_000, cuts=download.ATTEMPTS) as s:
        d = _entry(s.url("x"), body)
        with pytest.raises(DataUnavailableError, match="broke off") as e:
            download.fetch(d, tmp_path, progress=False)
        msg = _one_line(e)
        assert d.url in msg and os.path.join(str(tmp_path), "series.csv") in msg
        assert (tmp_path / "series.csv.part").read_bytes() == body[:10_000 * download.ATTEMPTS]
        assert not (tmp_path / "series.csv").exists()
        # the server now sends the rest: the next call resumes where the last attempt stopped
        path = download.fetch(d, tmp_path, progress=False)
        assert open(path, "rb").read() == body
        assert s.requests[-1] == f"bytes={10_000 * download.ATTEMPTS}-"


def test_checksum_mismatch_keeps_no_bad_file(tmp_path):
    body = _body()
    wrong = hashlib.sha256(b"another file").hexdigest()
    with LoopbackFileServer(body) as s:
        d = _entry(s.url("x"), body, sha=wrong)
        with pytest.raises(ValueError) as e:
            download.fetch(d, tmp_path, progress=False)
        msg = _one_line(e)
        assert hashlib.sha256(body).hexdigest() in msg and wrong in msg and d.url in msg
        assert os.listdir(tmp_path) == []  # neither the final name nor a .part


def test_bad_file_at_the_final_name_is_reported_not_deleted(tmp_path):
    body = _body()
    (tmp_path / "series.csv").write_bytes(b"hand-placed, wrong version")
    with LoopbackFileServer(body) as s:
        with pytest.raises(ValueError, match="expected " + hashlib.sha256(body).hexdigest()):
            download.fetch(_entry(s.url("x"), body), tmp_path, progress=False)
        assert s.requests == []
    assert (tmp_path / "series.csv").read_bytes() == b"hand-placed, wrong version"


def test_good_cached_file_survives_a_bad_source(tmp_path):
    """A file already cached is used without a request, whatever the source would send now."""
    body = _body()
    (tmp_path / "series.csv").write_bytes(body)
    with LoopbackFileServer(b"changed upstream") as s:
        path = download.fetch(_entry(s.url("x"), body), tmp_path, progress=False)
        assert open(path, "rb").read() == body and s.requests == []


def test_http_error_is_one_line_naming_url_and_where_to_place_the_file(tmp_path):
    body = _body(1000)
    with LoopbackFileServer(body, mode="error") as s:
        d = _entry(s.url("series.csv"), body)
        with pytest.raises(DataUnavailableError) as e:
            download.fetch(d, tmp_path, progress=False)
    msg = _one_line(e)
    assert "HTTP 500" in msg and d.url in msg
    assert f"place it at {os.path.join(str(tmp_path), 'series.csv')}" in msg
    assert os.listdir(tmp_path) == []


def test_offline_closed_port_is_one_line(tmp_path):
    body = _body(1000)
    d = _entry(closed_port_url("ETTh1.csv"), body, filename="ETTh1.csv")
    with pytest.raises(DataUnavailableError) as e:
        download.fetch(d, tmp_path / "cache", timeout=5, progress=False)
    msg = _one_line(e)
    assert d.url in msg and "connection refused" in msg
    assert os.path.join(str(tmp_path / "cache"), "ETTh1.csv") in msg


def test_cache_folder_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert download.cache_dir() == os.path.join(str(tmp_path / "xdg"), download.PROJECT)
    assert download.cached_path("ETTh1") == os.path.join(str(tmp_path / "xdg"), download.PROJECT,
                                                         "ETTh1.csv")
    assert download.cache_dir(tmp_path / "mine") == str(tmp_path / "mine")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert download.cache_dir("") == os.path.join(str(tmp_path / "home"), ".cache", download.PROJECT)
    with pytest.raises(ValueError, match="local folder"):
        download.cache_dir("gs://bucket/cache")
    with pytest.raises(ValueError, match="etth1, etth2, exchange_rate, llmfao"):
        download.dataset("ettm1")


@pytest.mark.parametrize("name", sorted(download.DATASETS))
def test_registry_pins_match_the_benchmark_copies(name, tmp_path):
    """Each pinned SHA-256 and size is that of the benchmark copy (the folder beside the
    checkout), and that copy, served over HTTP under the registry's file name, is fetched and
    verified."""
    d = download.DATASETS[name]
    copy = os.path.join(SHARED_DATA, d.filename)
    if not os.path.isfile(copy):
        pytest.skip(f"benchmark copy {d.filename} not beside the checkout (../shared/data)")
    body = open(copy, "rb").read()
    assert len(body) == d.size
    assert hashlib.sha256(body).hexdigest() == d.sha256
    with LoopbackFileServer(body) as s:
        local = Dataset(**{**d.__dict__, "url": s.url(d.filename)})
        path = download.fetch(local, tmp_path, progress=False)
    assert os.path.basename(path) == d.filename and download.is_cached(d, tmp_path)


def test_command_line_lists_the_cache(tmp_path, capsys):
    assert download.main(["--list", f"--data_dir={tmp_path}", "etth1"]) == 0
    out = capsys.readouterr().out
    assert "etth1" in out and "not cached" in out and download.DATASETS["etth1"].url in out


def test_optional_fetch_offline_says_how_to_get_the_file(tmp_path, capsys):
    body = _body(1000)
    d = _entry(closed_port_url("ETTh1.csv"), body, filename="ETTh1.csv")
    path, how = download.fetch_if_reachable(d, tmp_path, timeout=5, progress=False)
    assert path is None
    assert d.url in how and os.path.join(str(tmp_path), "ETTh1.csv") in how and d.sha256 in how
    assert "python -m core.data.download test" in how
    assert capsys.readouterr().out.count("\n") == 1  # the reason, on one line
    with LoopbackFileServer(body) as s:
        d = _entry(s.url("ETTh1.csv"), body, filename="ETTh1.csv")
        path, how = download.fetch_if_reachable(d, tmp_path, progress=False)
    assert how == "" and open(path, "rb").read() == body


def test_unusable_cache_folder_is_one_clear_error(tmp_path):
    body = _body(100)
    d = _entry(closed_port_url("x"), body)
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match="cannot create the cache folder"):
        download.fetch(d, tmp_path / "file" / "cache", progress=False)
    (tmp_path / "series.csv").mkdir()
    with pytest.raises(ValueError, match="is not a regular file"):
        download.fetch(d, tmp_path, progress=False)
