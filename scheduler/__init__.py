"""mq-scheduler: cron-style scheduler and delayed-delivery timer daemon for NATS JetStream."""

from __future__ import annotations

__version__ = "0.1.0"
