"""A griffe extension for the API reference: the docstrings' Sphinx roles as Markdown.

The docstrings write references as reStructuredText does (``:class:`~audiobuffer.Buffer```) and code in
double backticks. In the site a role naming a public name (``audiobuffer.X`` or ``X``, with ``X`` in
``audiobuffer.__all__``, or a member of one) becomes a link to that name's entry in the API reference (a
link that does not resolve fails the strict build); any other role becomes code, shown as written without
the role. An ``Example:`` section becomes ``Examples:``, which griffe shows as code.

The code keeps each protocol once, as a ``NOTE [ Title ]`` in a module docstring or comment, and
docstrings point to it by title. The site has no source files, so a docstring that points to a note
shows the note's text below itself, folded; a note written in a docstring shown becomes a bold title;
reStructuredText's ``::`` literal blocks become code blocks. A class's private bases (a class of a
private module, or whose name starts with ``_``) are left out of its "Bases:" line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import griffe

REPO = Path(__file__).resolve().parents[1]

_ROLE = re.compile(r":(?:class|func|meth|attr|data|exc|mod|obj):`(~?)([^`<>]+)`")
#: A note's title line in a module docstring (``NOTE [ Title ]`` then a line of ``=``) or comment.
_NOTE_HEAD = re.compile(r"^[ \t]*(?:# )?NOTE \[ ([^\]]+?) \][ \t]*\n[ \t]*(?:# )?=+[ \t]*$", re.MULTILINE)
#: A reference to a note, with the file it is in where one is named.
_NOTE_REF = re.compile(r"NOTE \[\s+([^\]]+?)\s+\](?: in this module| in `*[\w/.]*\w`*)?")
_PRIVATE = re.compile(r"(^|\.)_[^_]")


def notes(root: Path = REPO / "audiobuffer") -> dict[str, tuple[str, str]]:
    """Every note of the package: title -> (the file it is in, relative to the repository; its text as one
    paragraph per paragraph of the source, a literal block kept as a code block)."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for match in _NOTE_HEAD.finditer(text):
            lines = []
            comment = match.group(0).lstrip().startswith("#")
            for line in text[match.end():].splitlines()[1:]:
                if re.match(r"^[ \t]*(?:# )?NOTE \[ ", line):  # the next note
                    break
                if comment:
                    if not line.lstrip().startswith("#"):
                        break
                    line = line.lstrip()[1:].removeprefix(" ")
                elif '"""' in line:
                    break
                lines.append(line.rstrip())
            found[match.group(1)] = (path.relative_to(REPO).as_posix(), "\n".join(lines).strip())
    return found


def _literal_blocks(text: str) -> str:
    """reStructuredText's ``::`` literal blocks as fenced code blocks (``text::`` keeps ``text:``)."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and i + 1 < len(lines) and not lines[i + 1].strip():
            lead = line.rstrip()[:-2].rstrip()
            if lead:
                out.append(lead + ":")
            block, j = [], i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith((" ", "\t"))):
                block.append(lines[j])
                j += 1
            while block and not block[-1].strip():
                block.pop()
            while block and not block[0].strip():
                block.pop(0)
            indent = min((len(b) - len(b.lstrip()) for b in block if b.strip()), default=0)
            out += ["", "```text", *(b[indent:] for b in block), "```", ""]
            i = j
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def with_notes(text: str, known: dict[str, tuple[str, str]]) -> str:
    """``text`` with each note written in it as a bold title, and each note it points to shown below it."""
    text = _NOTE_HEAD.sub(lambda m: f"**{m.group(1)}**", text)
    cited: list[str] = []

    def cite(match: re.Match[str]) -> str:
        title = " ".join(match.group(1).split())
        if title not in known:
            return f"the note *{title}*"
        if title not in cited:
            cited.append(title)
        return f"the note *{title}*, below"

    text = _NOTE_REF.sub(cite, text)
    for title in cited:  # grows as the notes shown cite others: each is shown once
        where, body = known[title]
        shown = _literal_blocks(_NOTE_REF.sub(cite, body))
        text += f'\n\n??? note "{title} (a note in `{where}`)"\n' + "\n".join(
            f"    {line}" if line else "" for line in shown.splitlines())
    return text


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
        self.notes = {title: (where, convert(body, self.public)) for title, (where, body) in notes().items()}

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _literal_blocks(convert(obj.docstring.value, self.public))
            obj.docstring.value = with_notes(text, self.notes)
        if isinstance(obj, griffe.Class):
            obj.bases = [base for base in obj.bases
                         if not _PRIVATE.search(str(getattr(base, "canonical_path", base)))]
