"""Files that ship beside the package: the license matches setup.cfg, the changelog names the version."""

import configparser
import importlib.metadata
import re
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


def _requirements(value):
    """The distribution names of a setup.cfg requirement list, lower case ('pyyaml>=6' -> 'pyyaml')."""
    lines = (line.split("#")[0].strip() for line in value.splitlines())
    return {re.split(r"[\[<>=!~ ;]", line)[0].lower().replace("_", "-") for line in lines if line}


def _setup_cfg():
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg", encoding="utf-8")
    return setup


def test_getting_started_lists_what_pip_install_brings():
    """The install line's comment names every runtime requirement (torch is installed the line before)."""
    required = _requirements(_setup_cfg()["options"]["install_requires"]) - {"torch"}
    text = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if line.startswith("pip install -e .  "))
    assert not {name for name in required if name not in line.lower()}, line


def test_the_test_extra_brings_every_module_a_test_skips_without():
    """A new user's ``pip install -e ".[test]"`` runs every test: what a test imports or skips is in the
    runtime requirements or the test extra."""
    setup = _setup_cfg()
    provided = _requirements(setup["options"]["install_requires"]) | \
        _requirements(setup["options.extras_require"]["test"])
    needed = {m.split(".")[0] for f in (REPO / "tests").rglob("*.py")
              for m in re.findall(r'importorskip\("([\w.]+)"', f.read_text(encoding="utf-8"))}
    owners = importlib.metadata.packages_distributions()
    missing = {m: owners.get(m) for m in needed
               if not {d.lower().replace("_", "-") for d in [m, *owners.get(m, [])]} & provided}
    assert not missing, f"modules tests skip without, in no requirement of the test extra: {missing}"


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
