"""audiobuffer/cli/pack.py: ``audiobuffer pack SOURCE OUT --shard-size SIZE``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO, make_corpus, windows_text_files

from audiobuffer.cli.pack import main, parse_size
from audiobuffer.sources import INDEX_NAME, read_index


@pytest.mark.parametrize("text, expected", [
    ("1000000", 1_000_000), ("256MB", 256 * 10**6), ("256mb", 256 * 10**6), ("1GiB", 2**30),
    ("1.5G", 1_500_000_000), ("512k", 512_000), ("2Mi", 2 * 2**20), ("3 KiB", 3072), ("10B", 10),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MB", "12XB", "1iB", "-5MB", "0", "0.1", "1e6"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="--shard-size"):
        parse_size(text)


def test_pack_command(tmp_path, capsys):
    make_corpus(tmp_path / "src", 12, seconds=0.1)
    out = tmp_path / "out"
    code = main([str(tmp_path / "src"), str(out), "--shard-size", "10KB", "--labels", "parent", "--no-progress"])
    assert code == 0
    index = read_index(out / INDEX_NAME)
    assert len(index) == 12 and len(index.shards) > 1
    assert {m.label for m in index.members} == {"class0", "class1", "class2"}
    assert "packed 12 files" in capsys.readouterr().out


def test_pack_command_patterns_and_quiet(tmp_path, capsys):
    make_corpus(tmp_path / "src", 6, seconds=0.05)
    make_corpus(tmp_path / "src", 3, fmt="flac", seconds=0.05)
    code = main([str(tmp_path / "src"), str(tmp_path / "out"), "--shard-size", "1MiB", "--patterns", "**/*.flac",
                 "-q"])
    assert code == 0 and capsys.readouterr().out == ""
    assert all(m.name.endswith(".flac") for m in read_index(tmp_path / "out" / INDEX_NAME).members)


def _one_line_error(capsys, *parts):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("audiobuffer pack: error: "), err
    for part in parts:
        assert part in err, err


def test_pack_command_errors_are_one_line(tmp_path, capsys):
    make_corpus(tmp_path / "src", 3, seconds=0.05)
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    assert main([src, out, "--shard-size", "lots"]) == 2
    _one_line_error(capsys, "--shard-size", "'lots'")
    assert main([src]) == 2
    _one_line_error(capsys, "required", "-h")
    assert main([str(tmp_path / "missing"), out, "--shard-size", "1MB"]) == 2
    _one_line_error(capsys, "does not exist")
    assert main([src, out, "--shard-size", "1MB", "--labels", "(unclosed"]) == 2
    _one_line_error(capsys, "regular expression")
    assert main([src, out, "--shard-size", "1MB", "-q"]) == 0
    assert main([src, out, "--shard-size", "1MB", "-q"]) == 2
    _one_line_error(capsys, "not empty", "--overwrite")
    assert main([src, out, "--shard-size", "1MB", "-q", "--overwrite"]) == 0
    assert main(["-h"]) == 0
    assert main(["nosuchscheme://bucket/files", out, "--shard-size", "1MB"]) == 2  # fsspec knows no such URL
    _one_line_error(capsys, "cannot read 'nosuchscheme://bucket/files", "pip install")


@pytest.mark.subprocess
def test_audiobuffer_pack_runs_from_the_command_line(tmp_path, cli):
    make_corpus(tmp_path / "src", 4, seconds=0.05)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--shard-size", "1MB",
            "--no-progress"]
    # the entry point, in a process of its own
    ok = subprocess.run([sys.executable, "-m", "audiobuffer", *args], env=env, capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "out" / INDEX_NAME).is_file()
    again = cli(*args)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "not empty" in again.stderr


def test_index_has_the_same_bytes_where_text_files_write_crlf(tmp_path, monkeypatch):
    """index.json is written as UTF-8 bytes, so packing the same source gives the same bytes on Windows."""
    make_corpus(tmp_path / "src", 4, seconds=0.05)
    (tmp_path / "src" / "class0" / "0_\u65e5\u672c.wav").write_bytes((tmp_path / "src" / "class0" / "0_0000.wav")
                                                                       .read_bytes())
    assert main([str(tmp_path / "src"), str(tmp_path / "here"), "--shard-size", "1MB", "-q"]) == 0
    windows_text_files(monkeypatch)
    assert main([str(tmp_path / "src"), str(tmp_path / "windows"), "--shard-size", "1MB", "-q"]) == 0
    windows = (tmp_path / "windows" / INDEX_NAME).read_bytes()
    assert b"\r" not in windows and windows == (tmp_path / "here" / INDEX_NAME).read_bytes()
    assert len(read_index(tmp_path / "windows" / INDEX_NAME)) == 5
