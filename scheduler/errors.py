"""The exception tree of mq-scheduler. Foreign errors are translated at one point per system."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(SchedulerError, ValueError):
    """A setting is missing or has a wrong value; the message names the variable."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable
        self.problem = problem


class DurationError(SchedulerError, ValueError):
    """A duration (a setting, a YAML key, a CLI option) that cannot be read or is out of range;
    a ValueError, so pydantic reports it as the field's validation error."""

    def __init__(self, value: object, problem: str) -> None:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        super().__init__(f"{shown} {problem}")
        self.value = value
        self.problem = problem


class EnvelopeError(SchedulerError, ValueError):
    """A task envelope broke one or more rules; each problem names its field.

    `reason` is a short machine code (`unparseable`, `invalid_envelope`, `too_large`, `expired`,
    `too_far`, `org_mismatch`) used as a metric label and in the dead-letter record.
    """

    def __init__(self, problems: list[tuple[str, str]], reason: str = "invalid_envelope") -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in problems))
        self.problems = problems
        self.reason = reason

    @property
    def field(self) -> str:
        return self.problems[0][0]


class TargetRefusedError(SchedulerError, ValueError):
    """A task's target subject is outside the allow-list or under a refused prefix."""

    def __init__(self, subject: str, message: str) -> None:
        super().__init__(f"target '{subject}': {message}")
        self.subject = subject


class FencedError(SchedulerError, RuntimeError):
    """A state change was refused because a newer leader epoch exists."""

    def __init__(self, epoch: int) -> None:
        super().__init__(f"epoch {epoch} is fenced off: a newer leader has taken office")
        self.epoch = epoch


class EnginesRunningError(SchedulerError, RuntimeError):
    """A change that needs every engine stopped (`scheduler partitions set`) found signs of a
    running one; `signs` says which (lease keys held, fresh heartbeats)."""

    def __init__(self, signs: str) -> None:
        super().__init__(f"engines look alive ({signs})")
        self.signs = signs


class ServiceUnavailableError(SchedulerError, ConnectionError):
    """A backing service (NATS or PostgreSQL) could not be reached within the retry budget."""

    def __init__(self, service: str, detail: str) -> None:
        super().__init__(f"{service} unavailable: {detail}")
        self.service = service


class RequestError(SchedulerError, ValueError):
    """A management request (HTTP API, NATS service, CLI) that is wrong as asked.

    `code` is a short machine code (`bad_request`, `too_far`, `bad_cursor`, ...), `field` the
    input it is about when there is one; the message says what is wrong and what is expected.
    """

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field


class AuditInputError(SchedulerError, ValueError):
    """The drift audit cannot use its input (an option, a path, a log's columns); says which."""

    def __init__(self, what: str, problem: str) -> None:
        super().__init__(f"{what}: {problem}")
        self.what = what
        self.problem = problem
