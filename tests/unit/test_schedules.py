"""The scheduled_jobs YAML: job model, defaults, loader errors with file:line, jitter."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from scheduler.clock import rfc3339
from scheduler.cron.expression import CronExpr
from scheduler.cron.jobs import (
    Concurrency,
    Job,
    Misfire,
    ScheduleSet,
    jitter_for,
    load_dir,
    load_text,
    occurrence_key,
)

REPO_SCHEDULES = Path(__file__).resolve().parents[2] / "schedules"


def yaml_doc(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def one_job(**fields: object) -> str:
    """A file with one job: the minimal form plus `fields`, one `key: value` line each."""
    base: dict[str, object] = {
        "name": "nightly",
        "subject": "mq.scheduled.x",
        "cron": '"0 2 * * *"',
    }
    base.update(fields)
    lines = [f"    {key}: {value}" for key, value in base.items()]
    return "scheduled_jobs:\n  - " + "\n".join(lines).lstrip()


def errors_of(text: str) -> list[str]:
    return [str(error) for error in load_text(text, "s.yaml").errors]


def test_minimal_form_gets_every_default() -> None:
    """The platform standard's minimal job (name, subject, cron, data) is valid with defaults."""
    found = load_text(one_job(data='{"type": "x"}'), "s.yaml")
    assert found.ok
    (job,) = found.jobs
    assert job == Job(
        name="nightly",
        subject="mq.scheduled.x",
        cron=CronExpr.parse("0 2 * * *"),
        data={"type": "x"},
        type="scheduled.nightly",
        timezone=ZoneInfo("UTC"),
        priority=5,
        jitter=timedelta(0),
        misfire=Misfire.FIRE_ONCE,
        catchup_window=timedelta(hours=1),
        concurrency=Concurrency.ALLOW,
        ttl_seconds=None,
        paused=False,
        description="",
    )
    assert (job.file, job.line) == ("s.yaml", 2)


def test_data_defaults_to_empty_object() -> None:
    """A job without `data` sends an empty object."""
    assert load_text(one_job(), "s.yaml").jobs[0].data == {}


def test_every_field_set() -> None:
    """Every optional key is read and converted to its typed value."""
    text = one_job(
        type="billing.reconcile",
        timezone="Europe/Berlin",
        priority=1,
        jitter="90s",
        misfire="fire_all",
        catchup_window="1h30m",
        concurrency="forbid",
        ttl_seconds=600,
        paused="true",
        description='"Reconcile credits."',
    )
    job = load_text(text, "s.yaml").jobs[0]
    assert (job.type, job.timezone, job.priority) == (
        "billing.reconcile",
        ZoneInfo("Europe/Berlin"),
        1,
    )
    assert (job.jitter, job.catchup_window) == (timedelta(seconds=90), timedelta(minutes=90))
    assert (job.misfire, job.concurrency) == (Misfire.FIRE_ALL, Concurrency.FORBID)
    assert (job.ttl_seconds, job.paused, job.description) == (600, True, "Reconcile credits.")


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("0s", timedelta(0)),
        ("90s", timedelta(seconds=90)),
        ("5m", timedelta(minutes=5)),
        ("1h", timedelta(hours=1)),
        ("1h30m", timedelta(minutes=90)),
        ("2d", timedelta(days=2)),
        ("45", timedelta(seconds=45)),
        ('"45"', timedelta(seconds=45)),
    ],
)
def test_durations(written: str, expected: timedelta) -> None:
    """Durations take unit suffixes or a plain number of seconds."""
    assert load_text(one_job(jitter=written), "s.yaml").jobs[0].jitter == expected


@pytest.mark.parametrize("written", ["5x", "-1", "true", "1 h", "h", "null"])
def test_bad_durations(written: str) -> None:
    """A malformed or negative duration is an error on the key's line."""
    (error,) = errors_of(one_job(catchup_window=written))
    assert error.startswith("s.yaml:5: nightly: catchup_window: ")


@pytest.mark.parametrize("name", ["a", "credit-reconciliation", "job-2", "7am"])
def test_good_names(name: str) -> None:
    """Kebab-case names of lowercase letters and digits are accepted."""
    assert load_text(one_job(name=name), "s.yaml").ok


@pytest.mark.parametrize(
    "name", ["Nightly", "night_ly", "-nightly", "nightly-", "a--b", '""', "a.b"]
)
def test_bad_names(name: str) -> None:
    """A name that is not kebab-case is an error naming the value."""
    (error,) = errors_of(one_job(name=name))
    assert error.startswith("s.yaml:2: ") and "name: " in error


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        ("mq.scheduled.*", "contains a wildcard"),
        ("mq.>", "contains a wildcard"),
        ("mq.delay.reports", "is under mq.delay."),
        ("mq.dlq.reports", "is under mq.dlq."),
        ("$JS.API.INFO", "is under $JS."),
        ("$KV.bucket.key", "is under $KV."),
        ("$SYS.x", "is under $SYS."),
        ("_INBOX.abc", "is under _INBOX."),
        ("mq.Scheduled.x", "is not a lowercase dotted subject"),
        ("mq..x", "is not a lowercase dotted subject"),
        (".mq.x", "is not a lowercase dotted subject"),
        ('"mq.a b"', "is not a lowercase dotted subject"),
    ],
)
def test_bad_subjects(subject: str, problem: str) -> None:
    """Wildcards, refused prefixes and non-lowercase subjects are errors on the subject's line."""
    (error,) = errors_of(one_job(subject=subject))
    assert error.startswith("s.yaml:3: nightly: subject: ") and problem in error


def test_bad_cron_names_the_field() -> None:
    """A bad cron expression is reported with the cron parser's field-level message."""
    assert errors_of(one_job(cron='"0 2 * * 8"')) == [
        "s.yaml:4: nightly: cron: day-of-week field '8': value out of range 0-7"
    ]


def test_unknown_time_zone() -> None:
    """A time zone that is not an IANA name is an error."""
    (error,) = errors_of(one_job(timezone="Mars/Olympus"))
    assert error.startswith("s.yaml:5: nightly: timezone: unknown time zone 'Mars/Olympus'")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("priority", "0"),
        ("priority", "11"),
        ("priority", "true"),
        ("priority", '"5"'),
        ("ttl_seconds", "0"),
        ("ttl_seconds", "-5"),
        ("paused", '"yes"'),
        ("misfire", "later"),
        ("concurrency", "never"),
        ("type", '""'),
        ("type", '"a b"'),
        ("data", "[1, 2]"),
        ("data", "{when: 2026-01-01}"),
    ],
)
def test_bad_values(key: str, value: str) -> None:
    """Out-of-range, wrongly typed or non-JSON values are errors on their own line."""
    (error,) = errors_of(one_job(**{key: value}))
    assert error.startswith(f"s.yaml:5: nightly: {key}")


def test_unknown_key() -> None:
    """An unknown key is an error on its line that lists the known keys."""
    (error,) = errors_of(one_job(colour="red"))
    assert error.startswith("s.yaml:5: nightly: unknown key 'colour' (known: name, subject, cron")


def test_missing_keys_point_at_the_job() -> None:
    """A missing required key is reported at the job's first line."""
    text = yaml_doc(
        """
        scheduled_jobs:
          - subject: mq.scheduled.x
            data: {}
        """
    )
    assert errors_of(text) == [
        "s.yaml:2: missing required key 'name'",
        "s.yaml:2: missing required key 'cron'",
    ]


def test_all_errors_are_collected() -> None:
    """Every problem in every job is reported, not just the first one."""
    text = yaml_doc(
        """
        scheduled_jobs:
          - name: Bad_Name
            subject: mq.scheduled.>
            cron: "61 * * * *"
            timezone: Nowhere/City
          - name: good
            subject: mq.scheduled.good
            cron: "@daily"
          - name: other
            subject: mq.dlq.x
            cron: "* * *"
          - just a string
        """
    )
    found = load_text(text, "s.yaml")
    assert [job.name for job in found.jobs] == ["good"]
    assert [(e.line, e.job) for e in found.errors] == [
        (2, "Bad_Name"),
        (3, "Bad_Name"),
        (4, "Bad_Name"),
        (5, "Bad_Name"),
        (10, "other"),
        (11, "other"),
        (12, None),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "",
            "s.yaml:1: expected a mapping with top-level key 'scheduled_jobs', found an empty file",
        ),
        (
            "- name: a\n",
            "s.yaml:1: expected a mapping with top-level key 'scheduled_jobs', found a list",
        ),
        ("jobs: []\n", "s.yaml:1: unknown top-level key 'jobs' (expected only 'scheduled_jobs')"),
        (
            "scheduled_jobs:\n",
            "s.yaml:1: 'scheduled_jobs' must be a list of jobs (use [] for none)",
        ),
        ("scheduled_jobs: {a: 1}\n", "s.yaml:1: 'scheduled_jobs' must be a list of jobs"),
        ("scheduled_jobs:\n  - [a\n", "s.yaml:3: YAML syntax error: expected ',' or ']'"),
        ("scheduled_jobs: []\nscheduled_jobs: []\n", "s.yaml:2: duplicate key 'scheduled_jobs'"),
    ],
)
def test_file_level_errors(text: str, expected: str) -> None:
    """Empty files, wrong top-level shapes, syntax errors and duplicate keys are reported."""
    assert any(error.startswith(expected) for error in errors_of(text)), errors_of(text)


def test_missing_top_key_is_reported() -> None:
    """A mapping without `scheduled_jobs` says the key is missing."""
    assert "s.yaml:1: missing top-level key 'scheduled_jobs'" in errors_of("jobs: []\n")


def test_empty_job_list_is_valid() -> None:
    """`scheduled_jobs: []` is a valid file with no jobs."""
    found = load_text("scheduled_jobs: []\n", "s.yaml")
    assert found.ok and found.jobs == ()


def test_duplicate_key_in_job() -> None:
    """A key written twice in one job is an error on the second occurrence."""
    text = one_job() + '\n    cron: "0 3 * * *"'
    assert errors_of(text) == ["s.yaml:5: duplicate key 'cron'"]


def test_yaml_merge_keys_are_not_duplicates() -> None:
    """Overriding a key pulled in with a YAML merge (`<<`) is not a duplicate."""
    text = yaml_doc(
        """
        defaults: &defaults {subject: mq.scheduled.x, cron: "0 2 * * *"}
        scheduled_jobs:
          - <<: *defaults
            name: merged
            cron: "0 3 * * *"
        """
    )
    assert errors_of(text) == [
        "s.yaml:1: unknown top-level key 'defaults' (expected only 'scheduled_jobs')"
    ]
    assert load_text(text, "s.yaml").jobs[0].cron.text == "0 3 * * *"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(yaml_doc(text), encoding="utf-8")
    return path


def test_duplicate_names_across_files_point_at_both(tmp_path: Path) -> None:
    """A name defined in two files is an error at both places, and neither copy is kept."""
    write(tmp_path, "a.yaml", "scheduled_jobs:\n  - {name: x, subject: mq.a, cron: '@daily'}\n")
    write(
        tmp_path,
        "b.yml",
        "scheduled_jobs:\n  - {name: y, subject: mq.b, cron: '@daily'}\n"
        "  - {name: x, subject: mq.c, cron: '@hourly'}\n",
    )
    found = load_dir(tmp_path)
    a, b = tmp_path / "a.yaml", tmp_path / "b.yml"
    assert [str(e) for e in found.errors] == [
        f"{a}:2: x: duplicate job name 'x': also defined at {b}:3",
        f"{b}:3: x: duplicate job name 'x': also defined at {a}:2",
    ]
    assert [job.name for job in found.jobs] == ["y"]


def test_load_dir_reads_yaml_and_yml_only(tmp_path: Path) -> None:
    """`*.yaml` and `*.yml` files are read; other and hidden files are ignored."""
    write(tmp_path, "a.yaml", "scheduled_jobs:\n  - {name: a, subject: mq.a, cron: '@daily'}\n")
    write(tmp_path, "b.yml", "scheduled_jobs:\n  - {name: b, subject: mq.b, cron: '@daily'}\n")
    write(tmp_path, "notes.txt", "not yaml: [")
    write(tmp_path, ".draft.yaml", "not yaml: [")
    (tmp_path / "sub.yaml").mkdir()
    found = load_dir(tmp_path)
    assert found.ok and [job.name for job in found.jobs] == ["a", "b"]
    assert found.files == (str(tmp_path / "a.yaml"), str(tmp_path / "b.yml"))


def test_load_dir_reports_unreadable_file(tmp_path: Path) -> None:
    """A file that is not UTF-8 is an error for that file; the others still load."""
    (tmp_path / "bad.yaml").write_bytes(b"\xff\xfe\x00")
    write(tmp_path, "ok.yaml", "scheduled_jobs:\n  - {name: a, subject: mq.a, cron: '@daily'}\n")
    found = load_dir(tmp_path)
    assert [job.name for job in found.jobs] == ["a"]
    assert [(e.file, e.line) for e in found.errors] == [(str(tmp_path / "bad.yaml"), None)]


def test_load_dir_missing_folder(tmp_path: Path) -> None:
    """A folder that does not exist raises NotADirectoryError naming it."""
    with pytest.raises(NotADirectoryError, match="nope"):
        load_dir(tmp_path / "nope")


def test_repository_schedules_are_valid() -> None:
    """The shipped schedules hold the platform standard's three jobs (the drift audit runs as a
    Kubernetes CronJob, not as a message nobody consumes)."""
    found = load_dir(REPO_SCHEDULES)
    assert found.ok, [str(e) for e in found.errors]
    summary = {job.name: (job.subject, job.cron.text, job.data) for job in found.jobs}
    assert summary == {
        "credit-reconciliation": (
            "mq.scheduled.reconcile",
            "0 */6 * * *",
            {"type": "full_reconcile"},
        ),
        "usage-report": (
            "mq.scheduled.report",
            "0 2 * * *",
            {"type": "daily_usage", "granularity": "hourly"},
        ),
        "model-health-check": (
            "mq.scheduled.healthcheck",
            "*/5 * * * *",
            {"type": "provider_latency_probe"},
        ),
    }


def test_fingerprint_ignores_location_but_not_content() -> None:
    """A job's fingerprint is stable across files and lines and changes with any setting."""
    here = load_text(one_job(), "a.yaml").jobs[0]
    there = load_text("\n\n" + one_job(), "b.yaml").jobs[0]
    changed = load_text(one_job(priority=6), "a.yaml").jobs[0]
    assert here == there and here.fingerprint() == there.fingerprint()
    assert len(here.fingerprint()) == 32
    assert changed.fingerprint() != here.fingerprint()


def test_set_fingerprint_is_order_independent() -> None:
    """A schedule set's fingerprint depends on its jobs, not on file order."""
    a = "scheduled_jobs:\n  - {name: a, subject: mq.a, cron: '@daily'}\n"
    b = "scheduled_jobs:\n  - {name: b, subject: mq.b, cron: '@daily', data: {k: 1}}\n"
    one = load_text(a + b.removeprefix("scheduled_jobs:\n"), "x.yaml")
    two = load_text(b + a.removeprefix("scheduled_jobs:\n"), "y.yaml")
    assert one.fingerprint() == two.fingerprint()
    assert ScheduleSet((), (), ()).fingerprint() != one.fingerprint()


def test_get_by_name() -> None:
    """ScheduleSet.get finds a job by name or returns None."""
    found = load_text(one_job(), "s.yaml")
    assert found.get("nightly") is found.jobs[0]
    assert found.get("missing") is None


def test_job_is_frozen() -> None:
    """A Job is an immutable value."""
    job = load_text(one_job(), "s.yaml").jobs[0]
    with pytest.raises(AttributeError):
        job.priority = 1  # type: ignore[misc]


WHEN = datetime(2026, 11, 22, 6, tzinfo=UTC)


def test_occurrence_key_and_rfc3339() -> None:
    """The occurrence key is `<name>@<RFC 3339 UTC>`, as used for Nats-Msg-Id."""
    berlin = WHEN.astimezone(ZoneInfo("Europe/Berlin"))
    assert rfc3339(berlin) == "2026-11-22T06:00:00Z"
    assert occurrence_key("usage-report", berlin) == "usage-report@2026-11-22T06:00:00Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        rfc3339(datetime(2026, 1, 1))


def test_jitter_is_deterministic_and_bounded() -> None:
    """Jitter is the same for the same occurrence, within [0, jitter), and varies between them."""
    jitter = timedelta(minutes=5)
    delays = [jitter_for("job", WHEN + timedelta(hours=h), jitter) for h in range(200)]
    assert all(timedelta(0) <= d < jitter for d in delays)
    assert len(set(delays)) > 190
    assert jitter_for("job", WHEN, jitter) == delays[0]
    assert jitter_for("other-job", WHEN, jitter) != delays[0]


def test_zero_jitter() -> None:
    """No jitter configured means no delay."""
    assert jitter_for("job", WHEN, timedelta(0)) == timedelta(0)
