"""A config's problems in words: pydantic's errors and PyYAML's as one line each, values quoted short.

Every message names the key path (as the config wrote it: an old key name stays old), the value (cut
to ``QUOTE_CHARS`` characters, built piece by piece so that an alias bomb costs only its prefix) and
what is allowed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from ..options import MAX_PRODUCERS

__all__ = ["QUOTE_CHARS", "format_errors", "quote", "yaml_problem"]

#: How many characters of a value an error message quotes, and how many problems it lists.
QUOTE_CHARS = 80
_LISTED_ERRORS = 5


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages.

    The text is built piece by piece and the building stops at ``limit``, so a huge or recursive value
    (a YAML alias bomb: a few lines that expand to billions of strings) costs only its prefix.
    """
    pieces: list[str] = []
    size = 0
    for piece in _repr_pieces(value, limit):
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            break
    text = "".join(pieces)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _repr_pieces(value: Any, limit: int) -> Iterator[str]:
    if isinstance(value, (list, tuple, set, frozenset)):
        brackets = "[]" if isinstance(value, list) else "()" if isinstance(value, tuple) else "{}"
        yield brackets[0]
        for i, item in enumerate(value):
            if i:
                yield ", "
            yield from _repr_pieces(item, limit)
        yield brackets[1]
    elif isinstance(value, dict):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            if i:
                yield ", "
            yield from _repr_pieces(key, limit)
            yield ": "
            yield from _repr_pieces(item, limit)
        yield "}"
    elif isinstance(value, (str, bytes)):
        yield repr(value[:limit + 1])  # longer than the limit either way when cut
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        yield f"<an integer of {value.bit_length()} bits>"  # its decimal form costs time to build
    else:
        yield repr(value)


def _cut(text: str, limit: int = QUOTE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


#: Booleans in YAML 1.1 only: a config reads them as strings (YAML 1.2), and a boolean key says so.
_YAML_11_BOOLEANS = frozenset({"y", "n", "yes", "no", "on", "off"})

#: What a union-typed key accepts, said for people (pydantic reports each branch of the union).
_UNION_HELP = {"decode.size": "must be an integer or a list [height, width] of two integers",
               "buffer.num_producers": f"must be an integer in [1, {MAX_PRODUCERS}] or 'auto'",
               "loader.pin_memory": "must be true, false or 'auto'",
               "decode.augment.db": "must be a number of decibels or a list [low, high] of two",
               "decode.augment.snr_db": "must be a number of decibels or a list [low, high] of two",
               "decode.augment.source": "must be a path (a folder, manifest or index.json) or a list of paths"}


def _bounds(field: Any) -> list[str]:
    """The range a field's constraints allow, as ``['> 0', '<= 86400']``."""
    out = []
    for item in getattr(field, "metadata", ()):
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            bound = getattr(item, attr, None)
            if bound is not None:
                out.append(f"{sign} {bound:g}" if isinstance(bound, float) else f"{sign} {bound}")
    return out


def _entry_model(annotation: Any) -> type[BaseModel] | None:
    """The section model of a ``list[Model]`` annotation, else ``None``."""
    args = get_args(annotation) if get_origin(annotation) is list else ()
    item = args[0] if args else None
    return item if isinstance(item, type) and issubclass(item, BaseModel) else None


def _locate(loc: Sequence[Any], model: type[BaseModel]) -> tuple[list[str], Any, type[BaseModel] | None, bool]:
    """Walk an error's location through the models: (key parts, the field, the section model, in a union).

    A location inside a union-typed field names the union member pydantic tried (``'tuple[int, int]'``);
    the walk stops there, so the key is the field's.
    """
    parent: type[BaseModel] | None = model
    field: Any = None
    parts: list[str] = []
    entries: type[BaseModel] | None = None  # the model of a list of sections (decode.augment)
    for part in loc:
        if parent is not None and isinstance(part, str) and part in parent.model_fields:
            field = parent.model_fields[part]
            annotation = field.annotation
            parent = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
            entries = _entry_model(annotation)
            parts.append(part)
        elif entries is not None and isinstance(part, int):
            parent, entries = entries, None
            parts.append(str(part))
        elif parent is None and field is not None and isinstance(part, str):
            return parts, field, None, True
        else:
            parts.append(_cut(str(part), 40))
    return parts, field, parent, False


def _yaml_11_hint(value: Any) -> str:
    """A hint for a YAML 1.1 boolean (``yes``) given where a boolean belongs, else ''."""
    said = isinstance(value, str) and value.lower() in _YAML_11_BOOLEANS
    return " (YAML 1.2's only booleans: yes, no, on and off are not)" if said else ""


def _format_error(error: Mapping[str, Any], model: type[BaseModel],
                  written: Mapping[str, str]) -> tuple[str, str]:
    """One pydantic error as (key path, 'key.path: what is wrong, got VALUE'); ``written`` maps a key
    path to the one the config wrote (an old name of a renamed key)."""
    parts, field, parent, union = _locate(error["loc"], model)
    plain = ".".join(p for p in parts if not p.isdigit())
    key = ".".join(parts) or "(top level)"
    key = written.get(key, key)
    kind = error["type"]
    got = f"got {quote(error.get('input'))}"
    if kind == "missing":
        return key, f"{key}: required key is missing"
    if kind == "model_type" and parent is not None:
        return key, f"{key}: must be a section (a mapping of keys: {', '.join(parent.model_fields)}), {got}"
    if union:
        help_text = _UNION_HELP.get(plain, "does not fit any allowed form")
        return key, f"{key}: {help_text}{_yaml_11_hint(error.get('input'))}, {got}"
    bounds = _bounds(field)
    if bounds and kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"):
        what = f"{field.description} " if field.description else ""
        return key, f"{key}: must be {what}{' and '.join(bounds)}, {got}"
    if kind in ("bool_parsing", "bool_type"):
        return key, f"{key}: must be true or false{_yaml_11_hint(error.get('input'))}, {got}"
    if kind == "string_too_short":
        return key, f"{key}: must not be empty, {got}"
    message = str(error["msg"]).removeprefix("Value error, ")
    if ", got " in message:  # a rule's own message names the value it was given
        return key, f"{key}: {message}"
    return key, f"{key}: {message}, {got}"


def format_errors(exc: ValidationError, model: type[BaseModel], written: Mapping[str, str] | None = None) -> str:
    """Every problem on one line: unknown keys grouped by section, at most ``_LISTED_ERRORS`` problems.

    ``written`` maps a key path to the one the config wrote, which the message names (an old name).
    """
    lines: dict[str, Any] = {}  # key -> its line, or a section's list of unknown keys
    allowed: dict[str, str] = {}
    for error in exc.errors(include_url=False):
        if error["type"] == "extra_forbidden":
            parts, _, parent, _ = _locate(error["loc"], model)
            section = ".".join(parts[:-1])
            allowed[section] = ", ".join(parent.model_fields) if parent is not None else "none"
            lines.setdefault("\0" + section, []).append(parts[-1])
        else:
            key, line = _format_error(error, model, written or {})
            lines.setdefault(key, line)  # a union reports one error per member: keep the first
    listed = []
    for key, line in lines.items():
        if isinstance(line, list):  # unknown keys of one section
            section = key[1:]
            if len(line) == 1:
                where, what = ".".join(filter(None, (section, line[0]))), "unknown key"
            else:
                names = ", ".join(line[:8]) + (f" and {len(line) - 8} more" if len(line) > 8 else "")
                where, what = section or "(top level)", f"unknown keys {names}"
            line = f"{where}: {what}; allowed keys here: {allowed[section]}"
        listed.append(line)
    more = len(listed) - _LISTED_ERRORS
    return "; ".join(listed[:_LISTED_ERRORS]) + (f"; and {more} more" if more > 0 else "")


#: A backslash in double quotes starts an escape: what a Windows path in double quotes needs instead.
_ESCAPE_HINT = ("in double quotes a backslash starts an escape: write a Windows path in single quotes "
                "('C:\\data') or with forward slashes (C:/data)")


def yaml_problem(exc: BaseException) -> str:
    """What is wrong with a YAML text, on one line: 'not valid YAML at line 2, column 4: ...'."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        text = f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {_cut(str(exc.problem), 200)}"
        if exc.context:
            text += f" ({exc.context}"
            if exc.context_mark is not None:
                text += f" at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
            text += ")"
        if "unknown escape character" in str(exc.problem):
            text += f"; {_ESCAPE_HINT}"
    elif isinstance(exc, RecursionError):
        text = "not valid YAML: nested too deeply"
    elif isinstance(exc, yaml.YAMLError):
        text = f"not valid YAML: {_cut(str(exc), 200)}"
    else:  # a scalar that PyYAML recognised but cannot convert: a 5000-digit integer, 2020-13-45
        text = f"not valid YAML: a value cannot be converted: {_cut(str(exc).split(';')[0], 200)}"
    return " ".join(text.split())
