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
