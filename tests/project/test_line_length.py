"""Lines of at most 100 characters from now on: a new file has none longer, and a file written before
the rule has no more than it had (``long_lines.json``, which only ever shrinks).

    python tests/project/test_line_length.py     # write long_lines.json again, after shortening lines
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: The longest line the project writes.
LIMIT = 100
REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("audiobuffer", "tests", "scripts", "benchmarks", "docs")
BASELINE = Path(__file__).with_name("long_lines.json")


def long_lines() -> dict[str, int]:
    """Each Python file's count of lines over :data:`LIMIT`, by its path from the repository."""
    counts: dict[str, int] = {}
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            over = sum(len(line) > LIMIT for line in text.splitlines())
            if over:
                counts[path.relative_to(REPO).as_posix()] = over
    return counts


def test_no_file_has_more_long_lines_than_before():
    allowed = json.loads(BASELINE.read_text(encoding="utf-8"))
    grown = {name: (count, allowed.get(name, 0)) for name, count in long_lines().items()
             if count > allowed.get(name, 0)}
    assert not grown, (f"lines over {LIMIT} characters (found, allowed) in {grown}: wrap them "
                       f"(a new file has none)")


def test_the_baseline_names_only_files_that_exist():
    allowed = json.loads(BASELINE.read_text(encoding="utf-8"))
    gone = [name for name in allowed if not (REPO / name).is_file()]
    assert not gone, f"{BASELINE.name} names files that are gone: {gone}; write it again"


if __name__ == "__main__":
    BASELINE.write_text(json.dumps(long_lines(), indent=1, sort_keys=True) + "\n", encoding="utf-8",
                        newline="\n")
    print(f"wrote {BASELINE}", file=sys.stderr)
