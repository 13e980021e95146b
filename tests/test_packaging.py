"""Files that ship beside the package: the license matches setup.cfg, the changelog names the version."""

import configparser

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
