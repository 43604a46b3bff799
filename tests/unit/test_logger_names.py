"""Every logger the package makes is named after its module, so a log line's name says which
file wrote it (`scheduler.engine.delayed.dispatch`, not a name left from an older layout)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "scheduler"


def logger_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, argument) of each `logging.getLogger(...)` call given one argument, as source."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "logging"
            and len(node.args) == 1
        ):
            found.append((node.lineno, ast.unparse(node.args[0])))
    return found


def test_every_logger_of_the_package_is_named_by_its_module() -> None:
    """A logger of ours is `logging.getLogger(__name__)`; a quoted name is allowed only for
    another library's logger (`py4j`), which the package configures but does not write to."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent)
        for line, arg in logger_names(ast.parse(path.read_text(), str(path))):
            library = arg[:1] in "'\"" and not arg.strip("'\"").startswith("scheduler")
            quieted = str(where) == "scheduler/cli/main.py" and arg == "noisy"  # libraries'
            if arg != "__name__" and not library and not quieted:
                wrong.append(f"{where}:{line}: getLogger({arg})")
    assert wrong == []


def test_the_check_finds_a_name_that_matches_no_module() -> None:
    """The check above sees an old-layout name (so it can fail)."""
    tree = ast.parse('import logging\nlog = logging.getLogger("scheduler.firing")\n')
    assert logger_names(tree) == [(2, "'scheduler.firing'")]
