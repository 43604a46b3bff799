"""No function or method of the package is left that nothing in the package calls (only tests,
or nobody): code a reader must understand but that runs in no deployment."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scheduler"
# Named once in the package (their definition) and kept, each for a reason.
KEPT = {
    "eof_received": "asyncio.Protocol callback, called by the event loop",
    "get_reset_query": "asyncpg.Connection override, called by asyncpg's pool",
    "jump_wall": "FakeClock (the Clock port's twin for engine tests) moves wall time",
    # only tests call it: one line over the loader's private _load_one/_merge, which ten test
    # files build their jobs with (moving it would touch them all; left for a later pass)
    "load_text": "the YAML loader on text (load_dir's on files)",
}


def defined(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of the module's undecorated functions and its classes' methods."""
    found = []
    for node in tree.body:
        body = node.body if isinstance(node, ast.ClassDef) else [node]
        for item in body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not (
                item.decorator_list or item.name.startswith("__")
            ):
                found.append((item.lineno, item.name))
    return found


def unreferenced(sources: dict[Path, str], others: str) -> list[str]:
    """`path:line name` of each function whose name occurs nowhere but at its definition,
    across `sources` (Python) and `others` (templates, entry points)."""
    words = Counter(re.findall(r"\w+", "\n".join(sources.values()) + others))
    return [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path, text in sources.items()
        for line, name in defined(ast.parse(text))
        if words[name] <= 1 and name not in KEPT
    ]


def test_every_function_of_the_package_is_used_by_the_package() -> None:
    """Each function and method is named somewhere in the package besides its definition (its
    code, its templates, pyproject's entry points), or is listed in KEPT with the reason."""
    sources = {p: p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    templates = [p.read_text() for p in sorted(PACKAGE.rglob("*.html"))]
    others = "\n".join([*templates, (ROOT / "pyproject.toml").read_text()])
    assert unreferenced(sources, others) == []


def test_a_function_only_its_definition_names_is_found() -> None:
    """The check sees a method nothing calls (as `MemoryTaskStore.purge_intents` was)."""
    text = "class Store:\n    async def purge_intents(self) -> int:\n        return 0\n"
    assert unreferenced({PACKAGE / "x.py": text}, "") == ["scheduler/x.py:2 purge_intents"]
