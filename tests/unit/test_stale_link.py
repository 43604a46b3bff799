"""The stale-link watch's two pure parts (scheduler/bus/nats/link.py): when a missing PONG
makes a link stale, and which node a reconnect goes to."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import ParseResult, urlparse

import pytest

from scheduler.bus.nats.link import AVOID_FOR, LAG_LIMIT, TICK, ServerChoice, Silence


def _watch(silence: Silence, start: float, until: float, inbound: int = 0) -> float | None:
    """Look every TICK from `start` while a PING waits; the first time it is stale, or None."""
    now = start
    while now <= until:
        if silence.look(now, inbound, waiting=True):
            return now
        now += TICK
    return None


def test_a_ping_unanswered_for_stale_after_of_an_attentive_loop_is_stale() -> None:
    silence = Silence(stale_after=1.0)
    stale = _watch(silence, 0.0, 5.0)
    assert stale is not None and 1.0 <= stale <= 1.0 + 2 * TICK
    assert silence.silent_for(stale) >= 1.0


def test_no_ping_waiting_is_never_stale_and_an_answer_resets_the_count() -> None:
    silence = Silence(stale_after=1.0)
    assert _watch(silence, 0.0, 0.9) is None
    assert not silence.look(0.95, 0, waiting=False)  # the PONG came
    assert silence.silent_for(0.95) == 0.0
    stale = _watch(silence, 1.0, 5.0)  # the next PING counts from its own start
    assert stale is not None and stale >= 2.0


def test_a_late_tick_restarts_the_count_a_busy_loop_is_not_a_dead_server() -> None:
    silence = Silence(stale_after=1.0)
    assert _watch(silence, 0.0, 0.8) is None
    # the loop was held up for 3 s: the PONG may be in the socket, unread; not stale
    assert not silence.look(0.8 + TICK + LAG_LIMIT + 3.0, 0, waiting=True)
    restart = 0.8 + TICK + LAG_LIMIT + 3.0
    stale = _watch(silence, restart + TICK, restart + 5.0)
    assert stale is not None and stale - restart >= 1.0


def test_messages_coming_in_mean_the_server_is_alive_behind_a_backlog() -> None:
    silence = Silence(stale_after=1.0)
    now, inbound = 0.0, 0
    while now < 10.0:  # a PING waits 10 s, but acks keep coming
        inbound += 1
        assert not silence.look(now, inbound, waiting=True)
        now += TICK
    stale = _watch(silence, now, now + 5.0, inbound)  # they stop: a second later, stale
    assert stale is not None and 1.0 - TICK <= stale - now <= 1.0 + TICK


@dataclass
class _Server:
    uri: ParseResult
    reconnects: int = 0


def _servers(*netlocs: str) -> list[_Server]:
    return [_Server(urlparse(f"nats://{n}")) for n in netlocs]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_reconnect_passes_over_the_stale_node_while_another_is_eligible() -> None:
    clock = _Clock()
    choice = ServerChoice(clock=clock)
    pool = _servers("a:1", "b:2", "c:3")
    choice.stale("a:1")
    picked = {choice(pool, {})[0].uri.netloc for _ in range(200)}
    assert picked == {"b:2", "c:3"}
    clock.now += AVOID_FOR + 1  # long ago: eligible again
    assert "a:1" in {choice(pool, {})[0].uri.netloc for _ in range(200)}


def test_the_node_just_lost_is_passed_over_once_and_a_node_just_tried_is_waited_for() -> None:
    clock = _Clock()
    choice = ServerChoice(wait=1.0, clock=clock)
    pool = _servers("a:1", "b:2")
    choice.lost("a:1")
    server, delay = choice(pool, {})
    assert (server.uri.netloc, delay) == ("b:2", 0.0)
    clock.now += 0.1  # b refused: a, never tried by this choice, next, at once
    server, delay = choice(pool, {})
    assert (server.uri.netloc, delay) == ("a:1", 0.0)
    clock.now += 0.1  # a refused too: b again, once a second has passed since b was tried
    server, delay = choice(pool, {})
    assert server.uri.netloc == "b:2" and delay == pytest.approx(0.8)


def test_old_failures_do_not_delay_a_reconnect() -> None:
    """nats-py keeps a node's failure count until it next connects there; a node that failed
    minutes ago is tried at once, not after a wait."""
    clock = _Clock()
    choice = ServerChoice(wait=1.0, clock=clock)
    pool = _servers("a:1", "b:2", "c:3")
    for server in pool:
        server.reconnects = 5
    choice(pool, {})
    clock.now += 120.0
    choice.lost("a:1")
    choice.stale("a:1")
    _, delay = choice(pool, {})
    assert delay == 0.0


def test_a_single_node_is_tried_even_when_stale_and_lost() -> None:
    choice = ServerChoice(clock=_Clock())
    pool = _servers("only:4222")
    choice.stale("only:4222")
    choice.lost("only:4222")
    server, delay = choice(pool, {})
    assert (server.uri.netloc, delay) == ("only:4222", 0.0)
