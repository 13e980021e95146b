import audiobuffer


def test_all_is_sorted_and_every_name_exists():
    assert audiobuffer.__all__ == sorted(audiobuffer.__all__)
    for name in audiobuffer.__all__:
        assert hasattr(audiobuffer, name), name


def test_readme_lists_every_public_name():
    from helpers import REPO

    readme = (REPO / "README.md").read_text()
    missing = [n for n in audiobuffer.__all__ if n not in readme]
    assert not missing, f"public names missing from the README: {missing}"

