"""Start-up checks of the daemon that need no server: the nats-server version floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.bus.nats.connection import NatsBus
from scheduler.daemon.lifecycle import Daemon
from scheduler.errors import ConfigError
from scheduler.metrics import Metrics
from scheduler.settings import Settings


@pytest.mark.parametrize("version", ["2.9.10", "2.10.22"])
def test_old_nats_server_is_refused_unless_allowed(tmp_path: Path, version: str) -> None:
    """Below 2.10.23 the start fails naming the override; with the override it only warns."""

    class OldBus(NatsBus):
        @property
        def server_version(self) -> str:
            return version

    for allow in (False, True):
        s = Settings(data_dir=tmp_path, instance_id="t", allow_unsafe_nats=allow)
        daemon = Daemon(s)
        daemon.bus = OldBus(s, Metrics())
        if allow:
            daemon.core.check_server_version()
            assert any(version in w for w in daemon.warnings)
        else:
            with pytest.raises(ConfigError, match="SCHEDULER_ALLOW_UNSAFE_NATS"):
                daemon.core.check_server_version()


@pytest.mark.parametrize("version", ["2.10.23", "2.11.0", "2.15.1-beta"])
def test_supported_nats_server_passes(tmp_path: Path, version: str) -> None:
    class Bus(NatsBus):
        @property
        def server_version(self) -> str:
            return version

    daemon = Daemon(Settings(data_dir=tmp_path, instance_id="t"))
    daemon.bus = Bus(daemon.settings, Metrics())
    daemon.core.check_server_version()
    assert daemon.warnings == []


def test_unparseable_version_only_warns(tmp_path: Path) -> None:
    class Bus(NatsBus):
        @property
        def server_version(self) -> str:
            return "weird"

    daemon = Daemon(Settings(data_dir=tmp_path, instance_id="t"))
    daemon.bus = Bus(daemon.settings, Metrics())
    daemon.core.check_server_version()
    assert any("weird" in w for w in daemon.warnings)
