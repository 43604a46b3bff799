"""README.md stays a user's page that tells the truth: no benchmark figures in the status table
(bench/README.md holds them), links labelled with the page they open, the delay lane's
duplicate window as provisioning makes it, and the start-up line about `MQ_DELAY_NODEDUP`
explained in docs/operations.md."""

from __future__ import annotations

import re

from scheduler.bus.nats.connection import NODEDUP_DETAIL
from tests.support.docs_blocks import ROOT

README = (ROOT / "README.md").read_text()
# A measurement: a number with a unit of time, size or rate, or a ratio such as 49.5x.
FIGURE = re.compile(r"\d[\d.,]*\s*(?:ms|µs|MB|GB|s\b|x\b|%|tasks/s|/s\b)")


def section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_status_table_carries_no_benchmark_figures() -> None:
    """The status rows say what is done and link to bench/README.md for how fast."""
    figures = FIGURE.findall(section(README, "Status"))
    assert figures == []
    assert "## The figures behind the README's status" in (ROOT / "bench" / "README.md").read_text()


def test_a_link_labelled_with_a_page_opens_that_page() -> None:
    """`[docs/x.md](docs/y.md#...)`: the label names the page the link opens."""
    wrong = [
        m.group(0)
        for m in re.finditer(r"\[((?:docs|bench)/[\w.-]+\.md)\]\(([^)#]+)(?:#[^)]*)?\)", README)
        if m.group(1) != m.group(2)
    ]
    assert wrong == []


def test_the_delay_lanes_window_is_described_as_provisioning_makes_it() -> None:
    """The Operations bullet gives `MQ_DELAY` no 2-minute duplicate window (it has none on
    2.14+, its sealed source has it) and points at the section that explains it."""
    operations = " ".join(section(README, "Operations").split())
    lane = operations.split("stream `MQ_DELAY` (", 1)[1].split(") with the durable", 1)[0]
    assert "2 min" not in lane and "no duplicate window" in lane
    assert "MQ_DELAY_NODEDUP" in lane


def test_the_nodedup_start_up_line_is_explained() -> None:
    """docs/operations.md quotes, word for word, what the start-up log says of the empty
    stream, and says what to do about it."""
    operations = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    assert f"name=MQ_DELAY_NODEDUP status=created {NODEDUP_DETAIL}" in operations
    assert "Nothing to do" in operations
