"""The code blocks of README.md and docs/*.md, and how each is run (docs/development.md, "Code
blocks in the docs").

Every fenced block either runs or is marked, on the line above its fence, with
`<!-- docs-test: skip REASON -->` (not run here: helm, kubectl, a fragment) or
`<!-- docs-test: file NAME -->` (saved as NAME in the page's scratch directory, for the blocks
after it); `text` blocks are prose in a box and never run.
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
    marker: str = ""  # "skip" | "file" | "" (none)
    argument: str = ""  # the skip reason or the file name

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
    if block.marker and block.marker not in ("skip", "file"):
        return f"{block.where}: unknown marker 'docs-test: {block.marker}' (skip or file)"
    if block.marker and not block.argument:
        what = "a reason" if block.marker == "skip" else "a file name"
        return f"{block.where}: 'docs-test: {block.marker}' needs {what}"
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
