"""The start's JetStream calls wait out a cluster that is electing (scheduler/bus/nats/
connection.py, `while_electing`), and nothing else: any other error is raised at once."""

from __future__ import annotations

import pytest
from nats import errors as nats_errors
from nats.js import errors as js_errors

from scheduler.aio import Backoff
from scheduler.bus.nats.connection import electing, while_electing


class Steps:
    """A start step that fails with `errors` in turn, then answers "done"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def _unavailable(description: str) -> js_errors.ServiceUnavailableError:
    return js_errors.ServiceUnavailableError(code=503, err_code=10008, description=description)


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    async def instantly(self: object) -> None:
        return None

    monkeypatch.setattr(Backoff, "wait", instantly)


def test_a_timeout_and_temporarily_unavailable_are_an_election() -> None:
    assert electing(nats_errors.TimeoutError())
    assert electing(_unavailable("JetStream system temporarily unavailable"))
    assert not electing(_unavailable("JetStream not enabled for account"))
    assert not electing(js_errors.BadRequestError(code=400, description="stream name in use"))
    assert not electing(nats_errors.NoRespondersError())


async def test_the_step_is_run_again_until_the_cluster_answers() -> None:
    step = Steps(
        nats_errors.TimeoutError(), _unavailable("JetStream system temporarily unavailable")
    )
    assert await while_electing(step, "provision") == "done"
    assert step.calls == 3


async def test_any_other_error_is_raised_at_once() -> None:
    step = Steps(js_errors.BadRequestError(code=400, description="bad"), nats_errors.TimeoutError())
    with pytest.raises(js_errors.BadRequestError):
        await while_electing(step, "provision")
    assert step.calls == 1


async def test_the_last_timeout_is_raised_when_the_budget_is_spent() -> None:
    step = Steps(*(nats_errors.TimeoutError() for _ in range(5)))
    with pytest.raises(nats_errors.TimeoutError):
        await while_electing(step, "provision", budget=0.0)
    assert step.calls == 1
