"""MkDocs hooks of the documentation site: the parts of it made from the code at build time.

- ``<!-- config-reference -->`` becomes every key of a YAML pipeline config: its default, what it
  allows and what it does, read from the pydantic schema (``audiobuffer/config/schema.py``) and the
  comments of the reference config shipped with the package.
- ``<!-- cli-reference -->`` becomes every command of ``audiobuffer`` and its options, read from the
  argparse parsers (``audiobuffer.cli.main.command_parsers``), and ``scripts/train_audio.py``'s.
- ``<!-- api-reference -->`` becomes a mkdocstrings block for each name of ``audiobuffer.__all__`` (a
  new public name lands in the reference by itself) and of the public submodules.
- BENCHMARKS.md, its plots (``benchmarks/*.png``) and CHANGELOG.md join the site from the repository's
  root, included rather than copied.

The functions that make the Markdown work without MkDocs, so that ``tests/project/test_docs.py``
can check them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

CONFIG_MARKER = "<!-- config-reference -->"
CLI_MARKER = "<!-- cli-reference -->"
API_MARKER = "<!-- api-reference -->"

#: Files of the repository's root that are pages of the site: path in the repository -> path in the site.
ROOT_PAGES = {"BENCHMARKS.md": "benchmarks.md", "CHANGELOG.md": "changelog.md"}
#: Images of the repository that the included pages show: glob in the repository (kept at the same path).
ROOT_IMAGES = ("benchmarks/*.png",)

#: The API reference's sections for ``audiobuffer.__all__``, in reading order. A public name missing here
#: goes to a last section of its own, so it cannot be left out; a name here that is not public fails the build.
API_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Loaders", ("BufferedDataset", "IsolatedLoader", "BatchSlotLoader", "DevicePrefetcher", "DeviceTensorLoader")),
    ("Decoding and batching", ("AudioDecoder", "ImageDecoder", "Normalize", "pad_collate")),
    ("Sources and work items", ("Source", "WorkItem", "AUDIO_PATTERNS", "IMAGE_PATTERNS", "make_demo_corpus")),
    ("The buffer and the statistics", ("Buffer", "BufferStats", "DatasetStats", "SlotStats", "payload_nbytes")),
    ("Errors", ("AudioBufferError", "BufferClosed", "SourceError", "ConfigError", "ResumeError", "StallError",
                "StorageError", "HelperError", "ProducerError", "SampleError", "DecodeError")),
)
#: Public submodules, each with its own ``__all__``: (module, heading, names to leave out: shown above).
API_MODULES = (
    ("audiobuffer.features", "Features on any device: `audiobuffer.features`"),
    ("audiobuffer.augment", "Augmentations: `audiobuffer.augment`"),
    ("audiobuffer.config", "YAML pipelines: `audiobuffer.config`"),
    ("audiobuffer.sources", "Shards, indexes and items: `audiobuffer.sources`"),
)
#: Single names of deeper modules that users pass in.
API_EXTRA = (("audiobuffer.sources.storage", "Retry"),)


# -- the YAML reference ------------------------------------------------------------------------------


def _reference_comments() -> dict[tuple[str | None, str], str]:
    """Each key's comment in the reference config, as ``{(section or None, key): comment}``; the comment
    lines under a key (indented past it) continue its comment, and a commented-out key has one too."""
    from audiobuffer.config import reference_config

    comments: dict[tuple[str | None, str], str] = {}
    section: str | None = None
    last: tuple[str | None, str] | None = None
    for line in reference_config().splitlines():
        top = re.match(r"^([a-z_]+):(.*)$", line)
        inner = re.match(r"^\s+(?:#\s*)?([a-z_]+):(.*)$", line)
        more = re.search(r"\s#\s{3}(\S.*)$", line)  # "#   text": the comment above goes on
        if inner and more and last in comments:  # a commented-out key beside a comment that goes on
            assert last is not None
            comments[last] += " " + more.group(1).strip()
            last = (section, inner.group(1))
            continue
        if top:
            key, rest = top.groups()
            section = key if not rest.split("#", 1)[0].strip() else None
            last = (None, key)
        elif inner and section is not None:
            key, rest = inner.groups()
            last = (section, key)
        else:
            more = re.match(r"^\s{8,}#\s?(.*)$", line)  # a continuation, aligned under the comments above
            if more and last is not None and last in comments:
                comments[last] += " " + more.group(1).strip()
            continue
        comment = re.search(r"\s#\s(.*)$", rest)
        if comment:
            comments[last] = comment.group(1).strip()
    return comments


def _number(value: float) -> str:
    """A bound as people read it: ``86400``, ``2**63 - 1``."""
    if isinstance(value, float):
        return f"{value:g}"
    for offset, suffix in ((0, ""), (1, " - 1")):
        if value > 10**7 and ((value + offset) & (value + offset - 1)) == 0:
            return f"2**{(value + offset).bit_length() - 1}{suffix}"
    return str(value)


def _constraints(metadata: list[Any]) -> list[str]:
    """A field's numeric bounds and lengths, as ``>= 1``, ``<= 86400``."""
    found = []
    for item in metadata:
        if hasattr(item, "metadata") and not hasattr(item, "ge"):  # a pydantic Field inside an Annotated
            found += _constraints(item.metadata)
            continue
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("min_length", "length >=")):
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} {_number(value)}")
    return found


def _allowed(annotation: Any, metadata: list[Any] = ()) -> str:  # type: ignore[assignment]
    """What a field's annotation allows, in words: ``an integer >= 1 and <= 1024, or auto``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _allowed(args[0], [*args[1:], *metadata])
    if origin in (typing.Union, types.UnionType):
        parts = [_allowed(a, metadata) for a in args if a is not type(None)]
        text = ", or ".join(parts)
        return f"{text}, or null" if type(None) in args else text
    if origin is typing.Literal:
        return " | ".join("null" if a is None else _yaml(a) for a in args)
    bounds = _constraints(list(metadata))
    if origin is list and isinstance(args[0], type) and hasattr(args[0], "model_fields"):
        text = f"a list of mappings ({_entry_of(args[0])} entries)"
    elif origin is list:  # "a number > 0" -> "a list of numbers > 0"
        noun, _, rest = _allowed(args[0]).removeprefix("a ").removeprefix("an ").partition(" ")
        text = f"a list of {noun}s {rest}".rstrip()
    elif origin is tuple:
        text = "[" + ", ".join(_allowed(a).removeprefix("an ").removeprefix("a ") for a in args) + "]"
    elif origin is dict:
        text = "a mapping"
    else:
        text = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
            annotation, getattr(annotation, "__name__", str(annotation)))
    return f"{text} {' and '.join(bounds)}" if bounds else text


def _entry_of(model: Any) -> str:
    """The YAML key whose list holds ``model`` (a schema class): ``source.mix`` for ``MixEntry``."""
    from audiobuffer.config.schema import PipelineConfig

    for name, info in PipelineConfig.model_fields.items():
        for key, field in getattr(info.annotation, "model_fields", {}).items():
            if model in typing.get_args(field.annotation) or any(
                    model in typing.get_args(a) for a in typing.get_args(field.annotation)):
                return f"{name}.{key}"
    return model.__name__


def _yaml(value: Any) -> str:
    """A default as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped."""
    return " ".join(text.replace("|", "\\|").split())


def _prose(docstring: str | None) -> str:
    """A docstring's text as Markdown: reStructuredText's double backticks become single ones."""
    text = " ".join((docstring or "").split())
    return text.replace("``", "`")


def _what(comment: str | None, description: str | None) -> str:
    """What a key does: its comment in the reference config (unless it only lists the choices, which the
    table shows), else its description in the schema."""
    if comment and re.fullmatch(r"[\w.:]+( \| [\w.:]+)+", comment):
        comment = None
    return comment or description or ""


def config_reference() -> str:
    """Every key of a pipeline config, one table per section, made from the schema."""
    from pydantic import BaseModel

    from audiobuffer.config.schema import PipelineConfig

    comments = _reference_comments()
    top_rows: list[str] = []
    sections: list[str] = []
    for name, info in PipelineConfig.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows = []
            for key, field in annotation.model_fields.items():
                what = _what(comments.get((name, key)), field.description)
                allowed = _allowed(field.annotation, field.metadata)
                rows.append(f"| `{name}.{key}` | `{_yaml(field.default)}` | {_cell(allowed)} | {_cell(what)} |")
            required = " (required)" if info.is_required() else ""
            sections.append("\n".join([
                f"### `{name}`{required}", "", _prose(annotation.__doc__), "",
                "| key | default | allowed | what it does |", "|---|---|---|---|", *rows, ""]))
        else:
            what = _what(comments.get((None, name)), info.description)
            top_rows.append(f"| `{name}` | `{_yaml(info.default)}` | {_cell(_allowed(annotation, info.metadata))} "
                            f"| {_cell(what)} |")
    device = "`auto`, `cpu`, `cuda` or `cuda:N`"
    top = "\n".join(["### Top-level keys", "", "| key | default | allowed | what it does |", "|---|---|---|---|",
                     *(row.replace("| a string |", f"| {device} |") if row.startswith("| `device`") else row
                       for row in top_rows), ""])
    return "\n".join([*sections, top])


# -- the command-line reference ----------------------------------------------------------------------


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    if action.nargs == 0:
        return ", ".join(f"`{s}`" for s in action.option_strings)
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    suffix = f" {metavar} [{metavar} ...]" if action.nargs in ("+", "*") else f" {metavar}"
    return ", ".join(f"`{s}{suffix}`" for s in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return "required" if action.required and action.option_strings else ""
    if isinstance(action.default, list) and not action.default:
        return ""
    return f"`{action.default}`"


def _parser_markdown(title: str, parser: argparse.ArgumentParser, level: str = "###") -> str:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        help_text = (action.help or "") % {"default": action.default, "prog": parser.prog} if action.help else ""
        if action.choices is not None:
            help_text += f" (one of: {', '.join(str(c) for c in action.choices)})"
        rows.append(f"| {_argument(action)} | {_default(action)} | {_cell(help_text)} |")
    usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
    parts = [f"{level} {title}", "", f"```text\n{usage}\n```", ""]
    if parser.description:
        parts += [_cell(parser.description).replace("\\|", "|"), ""]
    if rows:
        parts += ["| argument | default | what it does |", "|---|---|---|", *rows, ""]
    if parser.epilog:
        parts += [_cell(parser.epilog).replace("\\|", "|"), ""]
    return "\n".join(parts)


def _train_script_parser(name: str) -> argparse.ArgumentParser:
    path = REPO / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_{name}_for_docs", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parser: argparse.ArgumentParser = module._parser()
    parser.prog = f"python scripts/{name}.py"
    return parser


def cli_reference() -> str:
    """Every ``audiobuffer`` command and its options, then the training scripts', from their parsers."""
    from audiobuffer.cli.main import command_parsers

    parts = ["Every command takes `-h` (`--help`); `audiobuffer --version` prints the version.", ""]
    parts += [_parser_markdown(f"`audiobuffer {name}`", parser) for name, parser in command_parsers().items()]
    for name in ("train_audio", "train_image"):
        parts.append(_parser_markdown(f"`scripts/{name}.py`", _train_script_parser(name)))
    return "\n".join(parts)


# -- the API reference -------------------------------------------------------------------------------


def api_names() -> list[tuple[str, list[str]]]:
    """The API reference's sections and the identifiers each renders, ``audiobuffer.__all__`` first.

    Raises:
        RuntimeError: a name in :data:`API_GROUPS` that ``audiobuffer.__all__`` does not have.
    """
    import audiobuffer

    public = list(audiobuffer.__all__)
    grouped = [name for _, names in API_GROUPS for name in names]
    stale = sorted(set(grouped) - set(public))
    if stale:
        raise RuntimeError(f"docs/hooks.py API_GROUPS names {stale}, which audiobuffer.__all__ does not have")
    sections = [(title, [f"audiobuffer.{n}" for n in names]) for title, names in API_GROUPS]
    rest = [f"audiobuffer.{n}" for n in public if n not in grouped]
    if rest:
        sections.append(("More", rest))
    for module_name, title in API_MODULES:
        module = importlib.import_module(module_name)
        names = [n for n in module.__all__ if n not in public]
        sections.append((title, [f"{module_name}.{n}" for n in names]))
    for module_name, name in API_EXTRA:
        sections.append((f"`{module_name}.{name}`", [f"{module_name}.{name}"]))
    return sections


def api_reference() -> str:
    """The API reference: a mkdocstrings block per public name, under a heading per section."""
    parts = []
    for title, identifiers in api_names():
        parts += [f"## {title}", ""]
        parts += [f"::: {identifier}\n" for identifier in identifiers]
    return "\n".join(parts)


# -- MkDocs events -----------------------------------------------------------------------------------

_GENERATED = {CONFIG_MARKER: config_reference, CLI_MARKER: cli_reference, API_MARKER: api_reference}


def _use_checkout() -> None:
    """Import audiobuffer from the checkout the site is built from, whichever one is installed."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def on_config(config: Any) -> Any:
    """Before anything is built: the package of this checkout first on ``sys.path`` (MkDocs restores the
    path it had after importing a hook, so importing this file is too early)."""
    _use_checkout()
    return config


def _root_files() -> Iterator[tuple[Path, str]]:
    for name, uri in ROOT_PAGES.items():
        yield REPO / name, uri
    for pattern in ROOT_IMAGES:
        for path in sorted(REPO.glob(pattern)):
            yield path, path.relative_to(REPO).as_posix()


def on_files(files: Any, config: Any) -> Any:
    """Add BENCHMARKS.md, CHANGELOG.md and the benchmark plots from the repository's root."""
    from mkdocs.structure.files import File

    for path, uri in _root_files():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def _unlink_outside(markdown: str, site_uris: set[str]) -> str:
    """In a page included from the repository's root, links are relative to the root: one to another
    included page or to a page in ``docs/`` points to it in the site, and one to a file of the repository
    that is not part of the site (a script, README.md) becomes its text and path, so no link is dead."""

    def replace(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target, re.I):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        site = ROOT_PAGES.get(path) or (path.removeprefix("docs/") if path.startswith("docs/") else path)
        if site in site_uris:
            return f"[{text}]({site}{hash_}{anchor})"
        return f"{text} (`{path}`)" if text.strip("`") != path else f"`{path}`"

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", replace, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill in the generated references; keep the included root pages free of dead links."""
    for marker, make in _GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    if page.file.src_uri in ROOT_PAGES.values():
        markdown = _unlink_outside(markdown, {f.src_uri for f in files})
    return markdown


if __name__ == "__main__":  # python docs/hooks.py config|cli|api: print a generated part
    _use_checkout()
    print({"config": config_reference, "cli": cli_reference, "api": api_reference}[sys.argv[1]]())
