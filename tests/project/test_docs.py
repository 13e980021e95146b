"""The documentation runs: every Python example of README.md and docs/, and the site's generated parts.

Each page is one test: its ```python blocks run in order in one namespace (as a user pastes them into
one script), in a fresh working folder that holds ``data/digits/`` (the demo corpus, 4 files a class:
``{label}_synth_{i}.flac``, 8 kHz, the label from the name with ``r"^(\\d+)_"``), with audiobuffer's cache
folder in the session's temporary folder (``make_demo_corpus()`` makes its 500 files there once). What
else a page needs (a manifest, shards, a YAML file) an earlier block of the page makes, as a user would.

A block directly after ``<!-- not run: REASON -->`` is not run; the reason must say it needs a GPU,
``torchrun`` or object-storage credentials. One that needs a GPU (its reason names a GPU or CUDA) runs
where CUDA is available.
"""

from __future__ import annotations

import gc
import importlib.util
import re
import shutil
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from helpers import JOIN_TIMEOUT, REPO

import audiobuffer
from audiobuffer import make_demo_corpus

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
#: A fenced block: its indentation (inside a list item), its language and its text.
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    re.MULTILINE | re.DOTALL)
_NOT_RUN = re.compile(r"<!--\s*not run\b(?P<rest>.*?)-->", re.DOTALL)
#: What a ``not run`` reason must name: the only things a test machine may lack. A block that needs a GPU
#: and nothing else runs where CUDA is available.
_GPU = re.compile(r"\b(GPU|CUDA)\b", re.IGNORECASE)
_ELSEWHERE = re.compile(r"\b(torchrun|credentials?|object storage|bucket)\b", re.IGNORECASE)


@dataclass
class Block:
    """A ```python block of a page: its first line's number, its code, and why it is not run (or None)."""

    line: int
    code: str
    not_run: str | None


def python_blocks(page: Path) -> list[Block]:
    """The page's Python blocks in order.

    Raises:
        ValueError: a ``not run`` comment without a reason, with a reason that is none of a GPU,
            torchrun or object-storage credentials, or that is not directly followed by a Python block.
    """
    text = page.read_text(encoding="utf-8")
    blocks: list[Block] = []
    used: set[int] = set()
    end = 0
    for fence in _FENCE.finditer(text):
        start, before = end, text[end:fence.start()].rstrip()
        end = fence.end()
        if fence.group("lang") not in ("python", "py"):
            continue
        line = text.count("\n", 0, fence.start()) + 2  # the block's first line of code
        last = before.rsplit("\n", 1)[-1].strip()
        comment = _NOT_RUN.fullmatch(last)
        reason = None
        if comment:
            used.add(start + before.rindex(last))
            reason = comment.group("rest").strip().removeprefix(":").strip()
            if not comment.group("rest").strip().startswith(":") or not reason:
                raise ValueError(f"{page.name}:{line - 1}: '<!-- not run -->' needs a reason: "
                                 f"'<!-- not run: REASON -->'")
            if not (_GPU.search(reason) or _ELSEWHERE.search(reason)):
                raise ValueError(f"{page.name}:{line - 1}: only examples that need a GPU, torchrun or object-storage "
                                 f"credentials may be left out, got the reason {reason!r}")
        indent = fence.group("indent")
        code = "".join(raw.removeprefix(indent) for raw in fence.group("body").splitlines(keepends=True))
        blocks.append(Block(line, code, reason))
    for comment in _NOT_RUN.finditer(text):
        if comment.start() not in used:
            line = text.count("\n", 0, comment.start()) + 1
            raise ValueError(f"{page.name}:{line}: a 'not run' comment must stand just before a ```python block")
    return blocks


def page_id(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


@pytest.fixture(scope="session")
def docs_data(tmp_path_factory):
    """The session's folders: the small demo corpus (copied into each page's working folder) and the
    cache folder ``make_demo_corpus()`` writes its default corpus to (once)."""
    root = tmp_path_factory.mktemp("docs-data")
    digits = make_demo_corpus(root / "corpus", per_class=4)
    (root / "cache").mkdir()
    return digits, root / "cache"


#: Threads that are not the page's to stop: tqdm's monitor serves every progress bar of the process and
#: ends by itself once no bar is left (it wakes every 10 s to look).
_NOT_OURS = {"tqdm_monitor"}


def _threads_left(before: set[threading.Thread]) -> list[str]:
    """The threads started since ``before`` still alive after up to ``JOIN_TIMEOUT`` seconds."""
    started = [t for t in threading.enumerate() if t not in before and t.name not in _NOT_OURS]
    deadline = time.monotonic() + JOIN_TIMEOUT
    for thread in started:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in started if t.is_alive()]


def runs_here(block: Block, cuda: bool) -> bool:
    """Whether ``block`` runs on this machine: always, unless it is marked ``not run``; then only where
    CUDA is available (``cuda``) if it needs a GPU and nothing else."""
    if block.not_run is None:
        return True
    return cuda and bool(_GPU.search(block.not_run)) and not _ELSEWHERE.search(block.not_run)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", PAGES, ids=[page_id(p) for p in PAGES])
def test_the_examples_of_the_page_run(page, docs_data, tmp_path, monkeypatch, no_helper_left_behind):
    blocks = [b for b in python_blocks(page) if runs_here(b, torch.cuda.is_available())]
    if not blocks:
        pytest.skip("no Python example to run")
    digits, cache = docs_data
    work = tmp_path / "work"
    shutil.copytree(digits, work / "data" / "digits", ignore=shutil.ignore_patterns("COMPLETE"))
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))  # as a script's own folder is: a module a page writes imports
    monkeypatch.setenv("AUDIOBUFFER_CACHE_DIR", str(cache))
    before = set(threading.enumerate())
    modules = set(sys.modules)
    namespace: dict = {"__name__": "__main__"}  # as in a user's script
    try:
        for n, block in enumerate(blocks):
            # Lines padded so that a traceback names the page's own line numbers.
            code = compile("\n" * (block.line - 1) + block.code, page_id(page), "exec")
            with warnings.catch_warnings():
                if page.name == "README.md" and n == 0:  # the first thing a new user copies runs clean
                    warnings.simplefilter("error")
                exec(code, namespace)
    finally:
        namespace.clear()
        for name in set(sys.modules) - modules:  # a module the page wrote goes with its folder
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(work)):
                del sys.modules[name]
        gc.collect()  # iterators left open (a loop left with break) stop their producers now
    left = _threads_left(before)
    assert not left, f"{page_id(page)} left threads running: {left}"


def test_a_not_run_comment_needs_a_reason_that_names_what_is_missing(tmp_path):
    page = tmp_path / "page.md"
    for comment, problem in (("<!-- not run -->", "needs a reason"), ("<!-- not run: -->", "needs a reason"),
                             ("<!-- not run: slow -->", "only examples that need"),
                             ("<!-- not run: needs a GPU -->\n\ntext", "must stand just before")):
        page.write_text(f"{comment}\n```python\nx = 1\n```\n", encoding="utf-8", newline="\n")
        with pytest.raises(ValueError, match=problem):
            python_blocks(page)
    page.write_text("<!-- not run: needs a CUDA GPU -->\n```python\nx = 1\n```\n\n  ```python\n  y = 2\n  ```\n",
                    encoding="utf-8", newline="\n")
    first, second = python_blocks(page)
    assert (first.not_run, first.code, second.not_run, second.code) == ("needs a CUDA GPU", "x = 1\n", None, "y = 2\n")
    for cuda in (False, True):
        assert (runs_here(first, cuda), runs_here(second, cuda)) == (cuda, True)


@pytest.mark.parametrize("reason, with_cuda", [("needs a CUDA GPU", True), ("needs torchrun and GPUs", False),
                                               ("needs object-storage credentials", False)])
def test_a_block_that_needs_a_gpu_and_nothing_else_runs_where_cuda_is(reason, with_cuda):
    block = Block(1, "x = 1\n", reason)
    assert (runs_here(block, cuda=False), runs_here(block, cuda=True)) == (False, with_cuda)


# -- the site ----------------------------------------------------------------------------------------


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    return [page for item in node for page in _nav_pages(item)]


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    generated = set(_hooks().ROOT_PAGES.values())
    assert sorted(pages - set(nav)) == [], "pages of docs/ missing from the nav in mkdocs.yml"
    assert sorted(set(nav) - pages - generated) == [], "nav entries with no page"
    assert len(nav) == len(set(nav)), "a page is twice in the nav"


def test_the_api_reference_shows_every_public_name():
    hooks = _hooks()
    assert hooks.API_MARKER in (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    shown = {identifier for _, identifiers in hooks.api_names() for identifier in identifiers}
    missing = [name for name in audiobuffer.__all__ if f"audiobuffer.{name}" not in shown]
    assert missing == []
    assert f"::: audiobuffer.{audiobuffer.__all__[0]}" in hooks.api_reference()


def test_the_yaml_and_cli_reference_shows_every_key_and_command():
    from audiobuffer.cli.main import command_parsers
    from audiobuffer.config.schema import PipelineConfig

    hooks = _hooks()
    page = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    assert hooks.CONFIG_MARKER in page and hooks.CLI_MARKER in page
    keys = hooks.config_reference()
    for name, field in PipelineConfig.model_fields.items():
        sub = getattr(field.annotation, "model_fields", None)
        for key in ([f"{name}.{k}" for k in sub] if sub else [name]):
            assert f"| `{key}` |" in keys, key
    commands = hooks.cli_reference()
    for name, parser in command_parsers().items():
        assert f"`audiobuffer {name}`" in commands
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help") and action.help != "==SUPPRESS==":
                    assert f"`{option}" in commands, f"audiobuffer {name} {option}"
    assert "`--max-batch-seconds S`" in commands  # scripts/train_audio.py's
    assert "`scripts/train_image.py`" in commands and "`--test-images" in commands


def test_the_yaml_reference_words_lists_of_entries_and_the_checkpoint_as_the_script_uses_them():
    keys = _hooks().config_reference()
    mix = next(line for line in keys.splitlines() if line.startswith("| `source.mix` |"))
    assert "a list of mappings (source.mix entries) length >= 2, or null" in mix and "Entrys" not in keys
    checkpoint = next(line for line in keys.splitlines() if line.startswith("| `train.checkpoint` |"))
    assert "--save-every" in checkpoint and "--resume" in checkpoint and "runs/CONFIG-NAME/last.pt" in checkpoint


def _griffe_roles():
    spec = importlib.util.spec_from_file_location("docs_griffe_roles", DOCS / "griffe_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_reference_shows_the_notes_docstrings_point_to():
    """The site has no source files: a docstring's pointer to a NOTE shows the note's text below it."""
    roles = _griffe_roles()
    notes = roles.notes()
    where, text = notes["Mixtures"]
    assert where == "audiobuffer/sources/mixture.py" and text.startswith("A mixture's items are its sources'")
    shown = roles.with_notes("Draws (NOTE [ Mixtures ] in `sources/mixture.py`).", notes)
    assert "NOTE [" not in shown and shown.startswith("Draws (the note *Mixtures*, below).")
    assert '??? note "Mixtures (a note in `audiobuffer/sources/mixture.py`)"\n    A mixture\'s items' in shown
    layout = roles._literal_blocks(notes["Shard layout"][1])
    assert "::" not in layout and "```text\nOUT/shard-000000.tar" in layout


def test_the_site_keeps_code_in_table_cells_whole_and_scrolls_code_blocks():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    css = "".join((DOCS / path).read_text(encoding="utf-8") for path in config.get("extra_css", []))
    assert re.search(r"td code[^{]*\{[^}]*white-space:\s*nowrap", css)
    assert re.search(r"pre > code[^{]*\{[^}]*overflow-x:\s*auto", css)
    python = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]["options"]
    assert python["separate_signature"] and python["line_length"] <= 100
    # mkdocstrings formats signatures with Black or Ruff where one is installed: the docs extra brings Ruff.
    assert "ruff" in (REPO / "setup.cfg").read_text(encoding="utf-8").split("\ndocs =", 1)[1].split("\n\n")[0]
