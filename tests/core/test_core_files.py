"""core.data.files: every way of failing to read a data file is one error naming the file."""

import gzip

import pytest

from core.data.files import read_bytes, read_text


def test_plain_gzip_and_bom_text(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(b"x,y\n3,4\n"))
    (tmp_path / "c.csv").write_bytes(gzip.compress(b"x\n5\n"))  # gzip without the extension
    (tmp_path / "d.csv").write_bytes("\ufeffx\n6\n".encode())
    assert read_text(str(tmp_path / "a.csv")) == "x,y\n1,2\n"
    assert read_text(str(tmp_path / "b.csv.gz")) == "x,y\n3,4\n"
    assert read_text(str(tmp_path / "c.csv")) == "x\n5\n"
    assert read_text(str(tmp_path / "d.csv")) == "x\n6\n"


def test_each_failure_is_one_error_naming_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        read_text(str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match="is a directory; expected a file"):
        read_text(str(tmp_path), "series")
    (tmp_path / "fake.csv.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="fake.csv.gz' ends in .gz but is not a gzip file"):
        read_bytes(str(tmp_path / "fake.csv.gz"))
    (tmp_path / "cut.gz").write_bytes(gzip.compress(b"a" * 1000)[:20])
    with pytest.raises(ValueError, match="cut.gz' is a corrupt or truncated gzip file"):
        read_bytes(str(tmp_path / "cut.gz"))
    (tmp_path / "latin.txt").write_bytes(b"ok line\nsecond \xff line\n")
    with pytest.raises(ValueError, match=r"latin.txt', line 2, column 8: not UTF-8 text \(byte 0xff\)"):
        read_text(str(tmp_path / "latin.txt"))
