"""`scheduler run --engines N` without processes: the option's bounds, where engines 2..N
write, and the edge serving their metrics beside the first engine's and its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.cli.main import main
from scheduler.daemon.crew import MAX_ENGINES, engine_folder, engine_instance
from scheduler.daemon.edge import FolderEngine
from scheduler.daemon.pair import ENGINE_METRICS, merge_expositions


@pytest.mark.parametrize("count", ["0", str(MAX_ENGINES + 1), "two"])
def test_engines_outside_1_to_the_bound_are_refused(
    count: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--engines` takes 1..MAX_ENGINES; anything else is a usage error naming the bound."""
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--engines", count])
    assert exit_.value.code == 2
    assert "--engines" in capsys.readouterr().err


def test_engines_with_a_role_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A role runs alone: `--engines 2 --role engine` exits 2 and says why."""
    assert main(["run", "--engines", "2", "--role", "engine"]) == 2
    assert "not with --role" in capsys.readouterr().err


def test_the_edge_serves_each_engines_metrics_under_its_own_role(tmp_path: Path) -> None:
    """Engine 1's export in the run folder, engine k's in engine-k/: the merged exposition has
    each sample once per engine, labelled role engine, engine-2, engine-3."""
    sample = b"# HELP mq_scheduler_partitions_held h\n# TYPE mq_scheduler_partitions_held gauge\n"
    (tmp_path / ENGINE_METRICS).write_bytes(sample + b"mq_scheduler_partitions_held 3.0\n")
    for k, held in ((2, 3), (3, 2)):
        folder = engine_folder(tmp_path, k)
        folder.mkdir()
        (folder / ENGINE_METRICS).write_bytes(
            sample + f"mq_scheduler_partitions_held {held}.0\n".encode()
        )
    view = FolderEngine(tmp_path)
    assert [role for role, _ in view.others()] == ["engine-2", "engine-3"]
    engine = view.metrics()
    assert engine is not None
    text = merge_expositions([("engine", engine), *view.others()]).decode()
    assert text.splitlines()[2:] == [
        'mq_scheduler_partitions_held{role="engine"} 3.0',
        'mq_scheduler_partitions_held{role="engine-2"} 3.0',
        'mq_scheduler_partitions_held{role="engine-3"} 2.0',
    ]
    assert engine_instance("host-1", 2) == "host-1-2"
