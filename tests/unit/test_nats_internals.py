"""The nats-py internals scheduler/bus/nats/wire.py relies on exist in the installed nats-py."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Mapping

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from scheduler.bus.nats import wire


def missing_internals(owners: Mapping[str, object]) -> list[str]:
    """The `Owner.attribute` names of `wire.NATS_INTERNALS` that the given objects (an instance
    or class per owner name) lack: what an installed nats-py no longer provides."""
    return [
        f"{owner}.{attr}"
        for owner, attr in wire.NATS_INTERNALS
        if not hasattr(owners[owner], attr)
        and attr not in getattr(owners[owner], "__dataclass_fields__", {})
    ]


def _installed() -> dict[str, object]:
    nc = Client()
    return {"Client": nc, "Subscription": Subscription(nc, 1), "Msg": Msg}


def test_the_installed_nats_py_has_every_internal_the_wire_uses() -> None:
    """Each private attribute listed in wire.NATS_INTERNALS exists in the installed nats-py."""
    missing = missing_internals(_installed())
    assert not missing, (
        f"the installed nats-py lacks {', '.join(missing)}, which scheduler/bus/nats/wire.py "
        "relies on: adapt wire.py or pin nats-py below this release in pyproject.toml"
    )


def test_a_missing_internal_is_named() -> None:
    """A client without one of the internals is reported by its owner and attribute name."""

    class OldClient(Client):
        def __getattribute__(self, name: str) -> object:
            if name == "_flush_queue":
                raise AttributeError(name)
            return super().__getattribute__(name)

    owners = _installed() | {"Client": OldClient()}
    assert missing_internals(owners) == ["Client._flush_queue"]


def test_no_other_module_touches_nats_py_internals() -> None:
    """Only wire.py reaches for the private attributes it lists (another object's, not self's)."""
    root = pathlib.Path(wire.__file__).parents[1]
    names = {attr for _, attr in wire.NATS_INTERNALS} - {"_id", "_client"}
    offenders = [
        f"{path.relative_to(root.parent)}: {name}"
        for path in root.rglob("*.py")
        if path.name != "wire.py"
        for name in names
        if re.search(rf"(?<!self)\.{name}\b", path.read_text())
    ]
    assert not offenders, offenders


def test_the_plain_publish_path_uses_only_nats_pys_public_api() -> None:
    """The nats-py adapter (`SCHEDULER_PUBLISH_PATH=nats_py`) and what it shares with the wire
    reach no private attribute of another object: only their own (`self._...`)."""
    import ast

    from scheduler.bus.nats import inflight, plain

    for module in (plain, inflight):
        tree = ast.parse(pathlib.Path(str(module.__file__)).read_text())
        private = [
            f"{ast.unparse(node)} (line {node.lineno})"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id == "self")
        ]
        assert private == [], f"{module.__name__} reaches private attributes: {private}"
