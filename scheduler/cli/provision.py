"""`scheduler provision [--replicas N]`: create what the daemon needs on NATS, and move existing
streams and buckets to N replicas, without the `nats` CLI.

It connects with the daemon's settings (SCHEDULER_NATS_URL and credentials), creates any
missing stream, consumer or bucket as the daemon's start does (SCHEDULER_PROVISION), with
`--replicas` (default SCHEDULER_STREAM_REPLICAS) replicas, then edits every existing one whose
replicas differ (scheduler/bus/nats/replicas.py). Safe to run while daemons run: nats-server
copies each stream to its new peers while it keeps taking writes.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from scheduler.bus.nats.connection import NatsBus, provision, while_electing
from scheduler.bus.nats.replicas import move_replicas, provisioned_streams
from scheduler.settings import Settings


class QuietBus:
    """The bus's events, unused by a one-shot command (this one and `partitions set`)."""

    def nats_link(self, up: bool) -> None:
        """Nothing to report: the command fails on its own calls."""

    def nats_disconnected(self) -> None:
        """Likewise."""

    def nats_stale_link(self) -> None:
        """Likewise."""

    def nats_reconnected(self) -> None:
        """Likewise."""


def replicas_arg(text: str) -> int:
    """1 to 5 (JetStream's own bound); ArgumentTypeError otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 5:
        raise argparse.ArgumentTypeError(f"{value} is out of range: JetStream allows 1 to 5")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of `scheduler provision`."""
    parser.add_argument("--config", help="YAML config file (keys as the SCHEDULER_* variables)")
    parser.add_argument(
        "--replicas",
        type=replicas_arg,
        default=None,
        metavar="N",
        help="replicas of every stream and bucket (default: SCHEDULER_STREAM_REPLICAS)",
    )


def cmd_provision(args: argparse.Namespace) -> int:
    from scheduler.settings import load_settings

    settings = load_settings(args.config)
    if args.replicas is not None:
        settings = settings.model_copy(update={"stream_replicas": args.replicas})
    for line in asyncio.run(provision_replicas(settings)):
        print(line)
    return 0


async def provision_replicas(settings: Settings) -> list[str]:
    """Create what is missing, then move every provisioned stream and bucket to
    `settings.stream_replicas`; a line per stream or bucket."""
    bus = NatsBus(settings, QuietBus(), "provision")
    await bus.connect(settings.startup_timeout.total_seconds())
    try:
        created = await bus.setup(
            while_electing(lambda: provision(bus, embedded=False), "provision")
        )
        assert bus.js is not None
        lines: list[Any] = [
            f"{note.kind} {note.name}: created" for note in created if note.status == "created"
        ]
        streams = provisioned_streams(settings, embedded=False)
        lines += await bus.setup(move_replicas(bus.js, streams, settings.stream_replicas))
    finally:
        await bus.close()
    return [str(line) for line in lines]
