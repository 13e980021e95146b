"""A griffe extension for the API reference: the docstrings' Sphinx roles as Markdown.

The docstrings write references as reStructuredText does (``:class:`~audiobuffer.Buffer```) and code in
double backticks. In the site a role naming a public name (``audiobuffer.X`` or ``X``, with ``X`` in
``audiobuffer.__all__``, or a member of one) becomes a link to that name's entry in the API reference (a
link that does not resolve fails the strict build); any other role becomes code, shown as written without
the role. An ``Example:`` section becomes ``Examples:``, which griffe shows as code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import griffe

REPO = Path(__file__).resolve().parents[1]

_ROLE = re.compile(r":(?:class|func|meth|attr|data|exc|mod|obj):`(~?)([^`<>]+)`")


def _public() -> set[str]:
    if str(REPO) not in sys.path:  # the package of the checkout the site is built from
        sys.path.insert(0, str(REPO))
    import audiobuffer

    return set(audiobuffer.__all__)


def convert(text: str, public: set[str]) -> str:
    """``text`` with its roles as Markdown: a link for a public name, else code."""

    def replace(match: re.Match[str]) -> str:
        short, target = match.group(1) == "~", match.group(2).strip()
        shown = target.rsplit(".", 1)[-1] if short else target
        owner = target.removeprefix("audiobuffer.").split(".", 1)[0]
        if owner in public:  # a member links to its owner's entry: not every member has one
            return f"[`{shown}`][audiobuffer.{owner}]"
        return f"`{shown}`"

    text = _ROLE.sub(replace, text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    # Google style's "Example:" is read as an admonition of Markdown; "Examples:" as code to show.
    return re.sub(r"^(\s*)Example:$", r"\1Examples:", text, flags=re.MULTILINE)


class SphinxRoles(griffe.Extension):
    """Rewrite each docstring's roles and double backticks as Markdown (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.public = _public()

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value, self.public)
