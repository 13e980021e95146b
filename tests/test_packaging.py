"""Files that ship beside the package: the license matches setup.cfg, the changelog names the version."""

import configparser
import subprocess
import sys

import pytest
from helpers import REPO

from audiobuffer import __version__


def test_license_file_matches_setup_cfg():
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg", encoding="utf-8")
    declared = setup["metadata"]["license"]
    assert declared == "MIT"
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License")
    assert "Permission is hereby granted, free of charge" in text


def test_changelog_lists_the_current_version():
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in text
    assert f"## [{__version__}]" in text


@pytest.mark.timeout(300)
def test_types_check_for_windows_too():
    """mypy follows sys.platform checks: the Windows branches are checked as Windows sees them (no
    resource, no os.nice, ctypes.windll), and no ignore is left unused there (warn_unused_ignores)."""
    pytest.importorskip("mypy")
    result = subprocess.run([sys.executable, "-m", "mypy", "--platform", "win32"], cwd=REPO, capture_output=True,
                            text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


#: Receivers whose ``.open()`` is no text file's: tar files, images, fsspec (binary modes), soundfile, descriptors.
_NOT_TEXT_OPENERS = {"tarfile", "Image", "fsspec", "sf", "soundfile", "os"}


def _unnamed_text_settings(path):
    """Each text file ``path`` opens, reads or writes without naming its encoding (the locale's is
    cp1252 on Windows), or writes without ``newline=`` (CRLF on Windows), as 'file:line: what'."""
    import ast

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
        if name in ("read_text", "write_text"):
            mode = "r" if name == "read_text" else "w"
        elif name == "fdopen" or (name == "open" and owner not in _NOT_TEXT_OPENERS):
            given = node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]
            if given and not (isinstance(given[0], ast.Constant) and isinstance(given[0].value, str)):
                continue  # os.open's flags, a mode computed at run time
            mode = given[0].value if given else "r"
            if "b" in mode:
                continue
        else:
            continue
        named = {k.arg for k in node.keywords}
        needed = {"encoding"} | ({"newline"} if set(mode) & set("wax+") else set())
        if not needed <= named:
            yield f"{path.relative_to(REPO)}:{node.lineno}: {name}() without {', '.join(sorted(needed - named))}"


def test_text_files_name_their_encoding_and_newline():
    """The package, its scripts, benchmarks and the site's hooks read and write the same bytes anywhere: UTF-8, \\n."""
    found = [problem for folder in ("audiobuffer", "scripts", "benchmarks", "docs")
             for path in sorted((REPO / folder).rglob("*.py")) for problem in _unnamed_text_settings(path)]
    assert found == []
