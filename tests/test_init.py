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


def test_the_readmes_first_example_runs_without_a_warning(tmp_path, monkeypatch):
    # The first thing a new user copies must run clean on a machine without a GPU.
    import re
    import warnings

    from helpers import REPO, write_tone

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    code = re.search(r"## Use\n+```python\n(.*?)```", readme, re.S).group(1)
    assert '"data/fsdd/recordings"' in code
    for i in range(12):  # named like FSDD's files, which the example's label pattern reads
        write_tone(tmp_path / "data" / "fsdd" / "recordings" / f"{i % 3}_george_{i}.wav", seconds=0.2)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(compile(code.replace("        ...", "        pass"), "README.md", "exec"), {})
