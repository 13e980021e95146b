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



def test_a_lazy_name_is_never_hidden_by_its_module_of_the_same_name():
    # importing a module for index_shards must not hide the function ``pack``
    import subprocess
    import sys

    code = ("from audiobuffer.sources import index_shards, pack; from audiobuffer import sources; "
            "assert callable(pack) and sources.pack is pack and callable(index_shards), pack")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
