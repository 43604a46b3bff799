"""observe_many must leave a histogram exactly as `count` single observations would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from scheduler.metrics import LATENESS_BUCKETS, observe_many


def _hist(labels: bool = False) -> tuple[CollectorRegistry, Histogram]:
    reg = CollectorRegistry()
    names = ["kind"] if labels else []
    return reg, Histogram("h_seconds", "h", names, buckets=LATENESS_BUCKETS, registry=reg)


@pytest.mark.parametrize(
    "samples", [[(0.0004, 3)], [(0.003, 1), (0.07, 250)], [(99.0, 7), (0.025, 2), (1.0, 1)]]
)
def test_same_exposition_as_repeated_observe(samples: list[tuple[float, int]]) -> None:
    reg_a, a = _hist(labels=True)
    reg_b, b = _hist(labels=True)
    for amount, n in samples:
        observe_many(a.labels("delayed"), amount, n)
        for _ in range(n):
            b.labels("delayed").observe(amount)
    got, want = _samples(reg_a), _samples(reg_b)
    assert got.keys() == want.keys() and got
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key  # the sum: float addition order


def _samples(reg: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("le", "")): s.value
        for metric in reg.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_labelled_parent_is_refused_like_observe() -> None:
    _, h = _hist(labels=True)
    with pytest.raises(ValueError):
        observe_many(h, 0.1, 3)
