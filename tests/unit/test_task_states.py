"""The status rule of `delayed_messages` is written once (scheduler.store.postgres.task_states): no
SQL
elsewhere in scheduler/ spells a task's state by hand.

The check reads every string literal of the package (f-strings with their placeholders as
`{}`; docstrings left out, they explain the rule) and flags what only the rule's module may
write: a comparison or assignment of `claimed_epoch`, and a comparison of `status` with a
ready or claimed status, literal or a placeholder for one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from scheduler.store.postgres import task_states as states

PACKAGE = Path(__file__).resolve().parents[2] / "scheduler"
RULE_MODULE = PACKAGE / "store" / "postgres" / "task_states.py"
_HELD = r"'(?:pending|in_doubt|claimed|\{\})'"
HAND_SPELLED = re.compile(
    r"\bclaimed_epoch\s*(?:IS\b|=|<>|!=|<|>)"
    rf"|\bstatus\s*(?:=|<>|!=)\s*{_HELD}"
    rf"|\bstatus\s+(?:NOT\s+)?IN\s*(?:\([^)]*{_HELD}|\{{\}})"
    r"|'pending'\s*,\s*'in_doubt'",  # the ready statuses as a list
    re.IGNORECASE,
)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of `tree` (module, classes, functions)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                found.add(id(body[0].value))
    return found


def _text(node: ast.AST) -> str | None:
    """A string literal's text, an f-string's with `{}` for each placeholder."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) or "{}" for v in node.values)
    return None


def hand_spelled(source: str) -> list[tuple[int, str]]:
    """(line, matched text) of every string literal in `source` that spells the rule."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        text = None if id(node) in skip else _text(node)
        for match in HAND_SPELLED.finditer(text or ""):
            assert isinstance(node, ast.expr)  # only string literals have a text
            out.append((node.lineno, match.group(0)))
    return sorted(set(out))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) FROM delayed_messages WHERE status = 'pending'",
        "SELECT id FROM delayed_messages d WHERE d.status IN ('pending', 'in_doubt')",
        "UPDATE delayed_messages SET claimed_epoch = NULL WHERE id = $1",
        "SELECT id FROM delayed_messages WHERE claimed_epoch IS NOT NULL",
        "SELECT id FROM delayed_messages WHERE status <> 'claimed'",
        "SELECT id FROM delayed_messages WHERE status IN {}",
        "READY = \"('pending', 'in_doubt')\"",
    ],
)
def test_the_check_flags_a_hand_spelled_status(sql: str) -> None:
    """Each way of writing the rule by hand in a query is caught, in a plain string and in
    an f-string alike (the check could fail)."""
    plain = f"SQL = {sql!r}\n"
    formatted = "n = 1\nSQL = f" + repr(sql.replace("{}", "{n}") + " LIMIT {n}") + "\n"
    assert hand_spelled(plain) and hand_spelled(formatted)


def test_the_check_leaves_the_rule_module_and_plain_words_alone() -> None:
    """Statuses that are not the rule's, bare column lists and docstrings pass; the rule's
    module itself spells it (it is where it lives)."""
    source = (
        '"""A docstring may say status = \'pending\' AND claimed_epoch IS NULL."""\n'
        "A = \"SELECT claimed_epoch, claimed_at FROM delayed_messages WHERE status = 'dead'\"\n"
        "B = \"UPDATE delayed_messages SET status = 'cancelled' WHERE status = $2\"\n"
        'C = ("pending", "claimed")\n'
    )
    assert hand_spelled(source) == []
    assert hand_spelled(RULE_MODULE.read_text())


def test_no_query_in_the_package_spells_the_status_rule_by_hand() -> None:
    """Every statement that selects, counts or changes tasks by state in scheduler/ takes its
    predicate from scheduler.store.postgres.task_states."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != RULE_MODULE
        for line, text in hand_spelled(path.read_text())
    ]
    assert offenders == []


def test_pending_means_not_claimed_and_each_status_keeps_its_literal() -> None:
    """`pending` and `in_doubt` are their literal status (their partial index) and no claim;
    claimed covers both ready statuses and rows an older daemon left `claimed`."""
    assert states.unclaimed("pending") == "status = 'pending' AND claimed_epoch IS NULL"
    assert states.unclaimed("in_doubt", "d") == "d.status = 'in_doubt' AND d.claimed_epoch IS NULL"
    assert states.claimed() == (
        "(status = 'claimed' OR status IN ('pending', 'in_doubt') AND claimed_epoch IS NOT NULL)"
    )
    assert states.reported() == f"CASE WHEN {states.claimed()} THEN 'claimed' ELSE status END"
    with pytest.raises(ValueError, match="status: 'fired' is not one of"):
        states.unclaimed("fired")


def test_a_cancel_answers_in_doubt_for_a_doubted_task_being_republished() -> None:
    """A claimed task that was once in doubt answers `in_doubt` (it may be delivered); any
    other row answers its reported status."""
    assert states.answered("d") == (
        f"CASE WHEN {states.claimed('d')} AND d.doubted THEN 'in_doubt' "
        f"ELSE {states.reported('d')} END"
    )
