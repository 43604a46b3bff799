"""`free_port`: a port for a server started here, outside the kernel's ephemeral range, so an
outgoing connection cannot take it before the server binds it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from scheduler.daemon import embedded
from scheduler.daemon.embedded import LOWEST_PORT, free_port, port_is_free


def test_a_port_below_the_ephemeral_range_that_nothing_holds() -> None:
    low = embedded._ephemeral_low()
    if low <= LOWEST_PORT:  # the range is not readable here: the kernel's pick is all there is
        pytest.skip(f"no ephemeral range to stay below ({embedded.EPHEMERAL_RANGE}: {low})")
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= p < low for p in ports), sorted(ports)
    assert len(ports) > 1  # chosen at random, not one port for every caller
    for port in ports:
        assert port_is_free(port)


def test_a_held_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With the range squeezed to two ports and one of them held, the other is the answer."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        other = taken + 1 if port_is_free(taken + 1) else taken - 1
        assert port_is_free(other)
        range_file = tmp_path / "range"
        range_file.write_text(f"{max(taken, other) + 1}\t65000\n")
        monkeypatch.setattr(embedded, "EPHEMERAL_RANGE", range_file)
        monkeypatch.setattr(embedded, "LOWEST_PORT", min(taken, other))
        picks = {free_port() for _ in range(10)}
    assert picks == {other}


def test_without_a_readable_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(embedded, "EPHEMERAL_RANGE", tmp_path / "missing")
    port = free_port()
    assert 0 < port < 65536 and port_is_free(port)
