"""The code blocks of README.md and docs/*.md, and how each is run (docs/development.md, "Code
blocks in the docs").

Every fenced block either runs or is marked, on the line above its fence, with
`<!-- docs-test: skip REASON -->` (not run here: helm, kubectl, a fragment) or
`<!-- docs-test: file NAME -->` (saved as NAME in the page's scratch directory, for the blocks
after it) or `<!-- docs-test: region PATH NAME -->` (not run here: the block must equal the
lines between `region NAME` and `endregion NAME` comments in the repo's file PATH, which a test
of its own runs); `text` blocks are prose in a box and never run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = {"sh", "bash", "console", "python", "pycon", "json", "yaml"}
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(\w+)\s*(.*?)\s*-->$")


@dataclass(frozen=True, slots=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str = ""  # "skip" | "file" | "region" | "" (none)
    argument: str = ""  # the skip reason, the file name, or "PATH NAME" of a region

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def pages() -> list[Path]:
    """The pages whose blocks are tested: the README and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page`, in order, with the marker above each (if any)."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, lang = opening.group(1), opening.group(2).lower()
        end = i + 1
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        marker, argument = _marker_above(lines, i)
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, lang, text, marker, argument))
        i = end + 1
    return found


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(fence) and set(stripped) == {fence[0]}


def _marker_above(lines: list[str], fence_index: int) -> tuple[str, str]:
    above = fence_index - 1
    while above >= 0 and not lines[above].strip():
        above -= 1
    if above < 0 or (found := _MARKER.match(lines[above].strip())) is None:
        return "", ""
    return found.group(1), found.group(2)


def problem(block: Block) -> str | None:
    """Why `block` breaks the convention, or None."""
    if block.marker and block.marker not in ("skip", "file", "region"):
        return f"{block.where}: unknown marker 'docs-test: {block.marker}' (skip, file or region)"
    if block.marker and not block.argument:
        what = {"skip": "a reason", "file": "a file name"}.get(block.marker, "a path and a name")
        return f"{block.where}: 'docs-test: {block.marker}' needs {what}"
    if block.marker == "region":
        return _region_problem(block)
    if block.marker or block.lang == "text":
        return None
    if block.lang not in RUNNABLE:
        return (
            f"{block.where}: a ```{block.lang or '(no language)'} block neither runs nor is "
            "marked; see docs/development.md, 'Code blocks in the docs'"
        )
    if block.lang == "yaml" and "scheduled_jobs" not in block.text:
        return f"{block.where}: only scheduled_jobs YAML runs; mark other YAML (skip or file)"
    return None


def region(path: Path, name: str) -> str:
    """The lines of `path` between the comment lines `region NAME` and `endregion NAME`
    (`//` or `#` comments), without the blank lines at either end."""
    lines = path.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if _is_comment(line, f"region {name}")]
    ends = [i for i, line in enumerate(lines) if _is_comment(line, f"endregion {name}")]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError(
            f"{path.name}: region {name!r} needs one 'region {name}' comment line and one "
            f"'endregion {name}' after it (found {len(starts)} and {len(ends)})"
        )
    return "\n".join(lines[starts[0] + 1 : ends[0]]).strip("\n") + "\n"


def _is_comment(line: str, words: str) -> bool:
    stripped = line.strip()
    return any(stripped == f"{lead} {words}" for lead in ("//", "#"))


def _region_problem(block: Block) -> str | None:
    path_text, _, name = block.argument.partition(" ")
    path = ROOT / path_text
    if not name or " " in name.strip():
        return f"{block.where}: 'docs-test: region' needs a path and a name, got {block.argument!r}"
    if not path.is_file():
        return f"{block.where}: 'docs-test: region {block.argument}': no file {path_text}"
    try:
        expected = region(path, name.strip())
    except ValueError as exc:
        return f"{block.where}: {exc}"
    if block.text != expected:
        return (
            f"{block.where}: the block is not region {name.strip()!r} of {path_text} as it is "
            "now: copy the region into the page"
        )
    return None


def console_steps(text: str) -> list[tuple[str, str]]:
    """(command, expected output) for each `$ ` line of a console transcript."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"output before the first command: {line!r}")
    return [(command, "\n".join(out).rstrip()) for command, out in steps]
