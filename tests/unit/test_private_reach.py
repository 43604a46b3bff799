"""No module of the scheduler opens another object's private state (conventions.md: follow one
task "without opening a class's private state from another module"): `x._name` is only read or
written on `self` or `cls` (or `super()`), dunders aside, except for the few third-party
internals named below on purpose."""

from __future__ import annotations

import ast
from pathlib import Path

import scheduler

PACKAGE = Path(scheduler.__file__).parent
OWN = frozenset({"self", "cls"})

# Third-party internals used on purpose, by file (relative to the package): what is reached, why.
ALLOWED: dict[str, frozenset[str]] = {
    # nats-py's client: its pending buffer and flusher (frames handed over in one write), the
    # server's max_payload, the message dispatch raw frames bypass, a subscription's sid, and
    # the table of raw handlers this module hangs on the client
    "bus/nats/wire.py": frozenset(
        {
            "_flush_pending",
            "_flush_queue",
            "_id",
            "_max_payload",
            "_mqs_raw",
            "_pending",
            "_pending_data_size",
            "_process_msg",
        }
    ),
    # nats-py's PING with a PONG waiter of our own: `flush(timeout)` would leave a cancelled
    # waiter that breaks the client's read loop when its PONG comes (the stale-link watch)
    "bus/nats/link.py": frozenset({"_send_ping"}),
    # prometheus_client's Histogram buckets (observe_many: one observation counted n times)
    "metrics.py": frozenset({"_buckets", "_raise_if_not_observable", "_sum", "_upper_bounds"}),
    # PySpark's JVM gateway and active context
    "audit/output.py": frozenset({"_jsc", "_jvm"}),
    "audit/session.py": frozenset({"_active_spark_context"}),
    # namedtuple's public API (urlsplit's SplitResult), underscored to avoid field names
    "settings.py": frozenset({"_asdict", "_replace"}),
}


def _own(node: ast.expr) -> bool:
    """Whether `node` is the object's own reference: `self`, `cls` or `super()`."""
    if isinstance(node, ast.Name):
        return node.id in OWN
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "super"
        and not node.args
    )


def private_reaches(source: str, allowed: frozenset[str] = frozenset()) -> list[str]:
    """Every `x._name` in `source` where `x` is not the object itself, as `line: x._name`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        if _own(node.value) or name in allowed:
            continue
        found.append((node.lineno, node.col_offset, ast.unparse(node)))
    return [f"{line}: {text}" for line, _, text in sorted(found)]


def test_the_checker_flags_a_reach_into_another_objects_private_state() -> None:
    """The check finds `other._x` (read or written) and lets `self._x`, `cls._x`,
    `super()._x`, dunders and an allowed name pass."""
    source = (
        "class A:\n"
        "    def f(self, other):\n"
        "        self._mine = other._theirs\n"
        "        other._state = cls._shared + super()._base() + other.__dict__\n"
        "        return self.part._inner, lib._allowed\n"
    )
    assert private_reaches(source, frozenset({"_allowed"})) == [
        "3: other._theirs",
        "4: other._state",
        "5: self.part._inner",
    ]


def test_no_module_reaches_into_another_objects_private_state() -> None:
    """Across every module of the package, private attributes are touched only by their own
    object (or are the third-party internals listed in ALLOWED)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        allowed = ALLOWED.get(rel, frozenset())
        found += [f"scheduler/{rel}:{hit}" for hit in private_reaches(path.read_text(), allowed)]
    assert found == []
