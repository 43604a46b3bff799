"""`scheduler schedules import`'s readers: crontab files, Kubernetes CronJob manifests and
Celery beat configs become jobs that the YAML loader accepts, or are refused with the reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cron.expression import CronExpr, occurrences
from scheduler.cron.imported import (
    Outcome,
    Parsed,
    UnreadableInput,
    assemble,
    check_template,
    interval_cron,
    kebab,
    render,
    report,
)
from scheduler.cron.importers import detect_kind, is_system_crontab, read_source
from scheduler.cron.jobs import load_text

SUBJECT = "mq.scheduled.{name}"

CRONTAB = """\
# m h dom mon dow command
SHELL=/bin/bash
MAILTO=ops@example.com
*/15 * * * * /usr/local/bin/sync-users --quiet >> /var/log/sync.log 2>&1
CRON_TZ=Europe/Berlin
30 2 * * * /opt/backup/backup.sh full
0 9 1 * mon php /var/www/artisan report:monthly
@daily /usr/bin/logrotate /etc/logrotate.conf
@reboot /usr/local/bin/warm-cache
0 0 L * * /bin/month-end
0 0 15W * * /bin/mid-month
0 0 * * 5#3 /bin/third-friday
0 0 12 * * ? /bin/quartz
0 0 * * * echo "100%" | mail -s report ops
@every /bin/nope
5 4 * * sun
CRON_TZ=Mars/Olympus
0 1 * * * /bin/true
"""

CRONJOBS = """\
apiVersion: batch/v1
kind: CronJob
metadata:
  name: report.nightly
  namespace: analytics
spec:
  schedule: "30 2 * * *"
  timeZone: America/New_York
  concurrencyPolicy: Forbid
  startingDeadlineSeconds: 300
  jobTemplate:
    spec:
      template:
        spec:
          containers:
            - name: report
              image: registry.example.com/report:1.4
              args: ["--nightly"]
          restartPolicy: OnFailure
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: cache-warm}
spec:
  schedule: "@every 10m"
  concurrencyPolicy: Replace
  suspend: true
  jobTemplate: {}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: odd-days}
spec:
  schedule: "0 6 */2 * mon"
"""

CELERY = """\
import os
from datetime import timedelta
from celery import Celery
from celery.schedules import crontab, schedule, solar

app = Celery("proj")
app.conf.timezone = "Europe/London"
app.conf.beat_schedule = {
    "add-every-monday-morning": {
        "task": "tasks.add",
        "schedule": crontab(hour=7, minute=30, day_of_week="monday"),
        "args": (16, 16),
        "options": {"queue": "math", "expires": 600},
    },
    "every-30-seconds": {"task": "tasks.ping", "schedule": 30.0},
    "quarter-hours": {"task": "tasks.tick", "schedule": crontab(minute=[0, 15, 30, 45])},
    "every-7-minutes": {"task": "tasks.odd", "schedule": timedelta(minutes=7)},
    "sunset": {"task": "tasks.lights", "schedule": solar("sunset", -37.81, 144.96)},
    "both-days": {"task": "tasks.x", "schedule": crontab(0, 0, "fri", "1")},
    "dynamic": {"task": "tasks.y", "schedule": crontab(hour=os.environ["HOUR"])},
    "no-task": {"schedule": 60},
    "priority": {"task": "tasks.z", "schedule": 60, "options": {"priority": 9}},
}
app.conf.beat_schedule["hourly"] = {
    "task": "tasks.hourly",
    "schedule": schedule(run_every=timedelta(hours=1)),
    "kwargs": {"full": True},
}

@app.on_after_configure.connect
def setup(sender, **kwargs):
    sender.add_periodic_task(10.0, test.s("hello"), name="add every 10")
"""


def imported(text: str, kind: str, source: str = "src", **options: Any) -> Outcome:
    system = options.pop("system", False)
    return assemble([read_source(text, kind, source, system=system)], SUBJECT, **options)


def jobs_of(outcome: Outcome) -> dict[str, dict[str, Any]]:
    return {job.definition["name"]: job.definition for job in outcome.jobs}


def skipped_of(outcome: Outcome) -> dict[str, str]:
    return {s.name: s.reason for s in outcome.skipped}


def loads_clean(outcome: Outcome) -> None:
    found = load_text(render(outcome), "imported.yaml")
    assert found.errors == ()
    assert [job.name for job in found.jobs] == sorted(jobs_of(outcome))


# -- crontab -----------------------------------------------------------------------------------
def test_a_user_crontab_maps_its_entries_with_zone_env_and_command() -> None:
    """Time fields, macros, CRON_TZ and environment lines map; the command goes into data."""
    outcome = imported(CRONTAB, "crontab")
    jobs = jobs_of(outcome)
    assert jobs["sync-users"] == {
        "name": "sync-users",
        "subject": "mq.scheduled.sync-users",
        "cron": "*/15 * * * *",
        "timezone": "UTC",
        "data": {
            "command": "/usr/local/bin/sync-users --quiet >> /var/log/sync.log 2>&1",
            "env": {"SHELL": "/bin/bash"},
        },
        "description": "crontab line 4",
    }
    assert jobs["backup-sh-full"]["timezone"] == "Europe/Berlin"
    assert jobs["backup-sh-full"]["cron"] == "30 2 * * *"
    assert jobs["logrotate-logrotate-conf"]["cron"] == "@daily"
    assert jobs["php-artisan-report-monthly"]["cron"] == "0 9 1 * mon"
    assert "MAILTO" not in jobs["echo-100"]["data"]["env"]
    loads_clean(outcome)


def test_a_crontab_says_what_it_refuses_and_why() -> None:
    """@reboot, L, W, #, a sixth time field, an unknown macro or zone, a missing command."""
    reasons = skipped_of(imported(CRONTAB, "crontab"))
    assert reasons["warm-cache"].startswith("@reboot runs once when cron starts")
    assert "'L' is not cron syntax" in reasons["month-end"]
    assert "'15W' is not cron syntax" in reasons["mid-month"]
    assert "'5#3' is not cron syntax" in reasons["third-friday"]
    assert reasons["quartz"].startswith("a sixth time field '?'")
    assert reasons["nope"].startswith("unknown macro '@every'")
    assert reasons["crontab-line-16"].startswith("expected five time fields")
    assert reasons["true"] == "CRON_TZ=Mars/Olympus (line 17): unknown time zone (use an IANA name)"
    assert len(reasons) == 8


def test_a_crontab_notes_or_days_percent_signs_mail_and_commands() -> None:
    """Notes say what differs but is kept; they do not make the import incomplete."""
    outcome = imported(CRONTAB, "crontab")
    lines = report(outcome)
    either = "day-of-month and day-of-week both set: fires on either (as cron does)"
    assert f"src:7: php-artisan-report-monthly: note: {either}" in lines
    percent = "src:14: echo-100: note: the command holds an unescaped %"
    assert any(line.startswith(percent) for line in lines)
    assert any("MAILTO" in line for line in lines)
    assert any("runs data.command" in line for line in lines)
    assert any(line.startswith("src:9: warm-cache: skipped: @reboot") for line in lines)


def test_the_system_crontab_form_reads_the_user_column() -> None:
    """/etc/crontab and /etc/cron.d files have a user column; it goes into data.user."""
    text = "17 * * * * root cd / && run-parts --report /etc/cron.hourly\n25 6 * * * www\n"
    outcome = imported(text, "crontab", system=True)
    job = jobs_of(outcome)["cd"]
    assert job["data"] == {"command": "cd / && run-parts --report /etc/cron.hourly", "user": "root"}
    assert skipped_of(outcome)["crontab-line-2"].endswith("then a user and a command")
    assert is_system_crontab("/etc/crontab") and is_system_crontab("/etc/cron.d/backup")
    assert not is_system_crontab("/home/me/crontab")


def test_tz_sets_the_zone_only_until_cron_tz_does() -> None:
    """TZ= is read as the zone (with a note) unless CRON_TZ= is set; an empty one resets it."""
    text = (
        "TZ=Asia/Tokyo\n0 1 * * * /bin/a\nCRON_TZ=Europe/Paris\nTZ=Asia/Tokyo\n0 2 * * * /bin/b\n"
        "CRON_TZ=\nTZ=\n0 3 * * * /bin/c\n"
    )
    outcome = imported(text, "crontab", timezone="America/Chicago")
    jobs = jobs_of(outcome)
    assert [jobs[n]["timezone"] for n in "abc"] == ["Asia/Tokyo", "Europe/Paris", "America/Chicago"]
    assert any("time zone from TZ=" in note for note in outcome.jobs[0].notes)
    assert jobs["b"]["data"]["env"] == {"TZ": "Asia/Tokyo"}


def test_names_are_kebab_case_and_unique() -> None:
    """Two entries running the same program get `name`, `name-2`; odd characters become '-'."""
    text = "0 1 * * * /bin/Backup_DB.sh\n0 2 * * * /bin/backup_db.sh\n0 3 * * * >/dev/null\n"
    outcome = imported(text, "crontab")
    assert sorted(jobs_of(outcome)) == ["backup-db-sh", "backup-db-sh-2", "crontab-line-3"]
    assert kebab("Über  Nightly.Report!") == "ber-nightly-report"
    assert len(kebab("x" * 300)) == 100
    loads_clean(outcome)


# -- Kubernetes CronJobs -----------------------------------------------------------------------
def test_cronjob_manifests_map_schedule_zone_policy_suspend_and_deadline() -> None:
    """Every CronJob of a multi-document file maps; other kinds are passed over with a note."""
    outcome = imported(CRONJOBS, "cronjob")
    jobs = jobs_of(outcome)
    assert jobs["report-nightly"] == {
        "name": "report-nightly",
        "subject": "mq.scheduled.report-nightly",
        "cron": "30 2 * * *",
        "timezone": "America/New_York",
        "data": {
            "cronjob": "report.nightly",
            "namespace": "analytics",
            "containers": [
                {
                    "name": "report",
                    "image": "registry.example.com/report:1.4",
                    "args": ["--nightly"],
                }
            ],
        },
        "concurrency": "forbid",
        "catchup_window": "300s",
        "description": "Kubernetes CronJob analytics/report.nightly",
    }
    assert jobs["cache-warm"]["cron"] == "*/10 * * * *"
    assert jobs["cache-warm"]["paused"] is True
    assert "concurrency" not in jobs["cache-warm"]
    replace = next(job for job in outcome.jobs if job.definition["name"] == "cache-warm")
    assert replace.lost and replace.lost[0].startswith("concurrencyPolicy Replace")
    assert not outcome.complete
    assert ("src", "line 21: kind 'ConfigMap' is not a CronJob: passed over") in outcome.notes
    loads_clean(outcome)


def test_a_stepped_star_day_keeps_kubernetes_or_meaning() -> None:
    """robfig/cron reads `*/2` with a weekday as either-day; the rewrite keeps those days."""
    job = jobs_of(imported(CRONJOBS, "cronjob"))["odd-days"]
    assert job["cron"] == "0 6 1-31/2 * mon"
    after = datetime(2026, 2, 1, tzinfo=UTC)
    days = [t.day for t in islice(occurrences(CronExpr.parse(job["cron"]), after, UTC), 6)]
    assert days == [1, 2, 3, 5, 7, 9]  # odd days, and Monday the 2nd and 9th


CRONJOB_REFUSED = {
    "six": ("0 0 12 * * ?", "Kubernetes reads five fields, not 6"),
    "last": ("0 0 L * *", "'L' is not cron that jobs here take"),
    "nth": ("0 0 * * 5#3", "'5#3' is not cron that jobs here take"),
    "seven": ("@every 7m", "every 7m divides no minute, hour or day evenly"),
    "bad-every": ("@every soon", "'soon' is not a duration"),
    "reboot": ("@reboot", "unknown macro"),
    "star-first": ("0 0 1,* * mon", "Kubernetes matches both (a '*' term)"),
    "range": ("0 0 * * 8", "day-of-week field '8': value out of range 0-7"),
}


@pytest.mark.parametrize(("name", "case"), CRONJOB_REFUSED.items(), ids=list(CRONJOB_REFUSED))
def test_a_cronjob_schedule_cron_cannot_take_is_refused(name: str, case: tuple[str, str]) -> None:
    """The entry is skipped with a reason naming spec.schedule and what is wrong."""
    schedule, reason = case
    text = f"kind: CronJob\nmetadata: {{name: {name}}}\nspec: {{schedule: '{schedule}'}}\n"
    found = skipped_of(imported(text, "cronjob"))
    assert list(found) == [name]
    assert found[name].startswith("spec.schedule")
    assert reason in found[name]


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("{schedule: '@daily', timeZone: Mars/Olympus}", "spec.timeZone 'Mars/Olympus': unknown"),
        ("{schedule: '@daily', concurrencyPolicy: Sometimes}", "not Allow, Forbid or Replace"),
        ("{schedule: '@daily', suspend: 'yes'}", "spec.suspend 'yes': not true or false"),
        ("{schedule: '@daily', startingDeadlineSeconds: 0}", "startingDeadlineSeconds 0"),
        ("{timeZone: UTC}", "spec.schedule: missing or not a string"),
        ("[]", "spec: missing or not a mapping"),
    ],
)
def test_a_cronjob_spec_that_is_wrong_is_refused(spec: str, reason: str) -> None:
    """A field Kubernetes itself would refuse skips the entry, naming the field."""
    found = skipped_of(imported(f"kind: CronJob\nmetadata: {{name: x}}\nspec: {spec}\n", "cronjob"))
    assert reason in found["x"]


def test_kubectl_list_output_and_a_tz_prefix_are_read() -> None:
    """`kubectl get cronjobs -o yaml` prints a List; a `TZ=` prefix becomes the zone."""
    text = (
        "apiVersion: v1\nkind: List\nitems:\n"
        "- kind: CronJob\n  metadata: {name: a}\n"
        "  spec: {schedule: 'CRON_TZ=Asia/Tokyo 0 9 * * *'}\n"
        "- kind: CronJob\n  metadata: {name: b}\n  spec: {schedule: '0 0 1 ? *'}\n"
    )
    jobs = jobs_of(imported(text, "cronjob"))
    assert jobs["a"]["cron"] == "0 9 * * *" and jobs["a"]["timezone"] == "Asia/Tokyo"
    assert jobs["b"]["cron"] == "0 0 1 * *"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: CronJob\nspec: [\n", "src:3: not YAML"),
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                for p, c in zip("abcdef", "bcdefg", strict=True)
            ),
            "more than 100000 values",
        ),
        ("x: !!python/object:os.system echo\n", "could not determine a constructor"),
    ],
    ids=["syntax", "alias-bomb", "python-tag"],
)
def test_unreadable_yaml_is_refused_whole(text: str, message: str) -> None:
    """A manifest that is not safe YAML is unreadable input, with the place."""
    with pytest.raises(UnreadableInput, match=message):
        read_source(text, "cronjob", "src")


# -- Celery beat -------------------------------------------------------------------------------
def test_celery_beat_crontab_and_interval_entries_map() -> None:
    """Literal crontab() fields, day names, intervals, the app's timezone, args and kwargs."""
    outcome = imported(CELERY, "celery")
    jobs = jobs_of(outcome)
    assert jobs["add-every-monday-morning"] == {
        "name": "add-every-monday-morning",
        "subject": "mq.scheduled.add-every-monday-morning",
        "cron": "30 7 * * mon",
        "timezone": "Europe/London",
        "data": {"task": "tasks.add", "args": [16, 16]},
        "ttl_seconds": 600,
        "description": "Celery beat entry 'add-every-monday-morning'",
    }
    assert jobs["every-30-seconds"]["cron"] == "*/30 * * * * *"
    assert jobs["quarter-hours"]["cron"] == "0,15,30,45 * * * *"
    assert jobs["hourly"]["cron"] == "0 * * * *"
    assert jobs["hourly"]["data"] == {"task": "tasks.hourly", "kwargs": {"full": True}}
    loads_clean(outcome)


def test_celery_entries_that_cannot_map_say_why() -> None:
    """solar, both day fields (Celery ANDs them), non-literal values, odd intervals,
    add_periodic_task, a missing task; options without a counterpart are reported lost."""
    outcome = imported(CELERY, "celery")
    reasons = skipped_of(outcome)
    assert "every 7m: that divides no minute, hour or day" in reasons["every-7-minutes"]
    assert reasons["sunset"].startswith("solar() follows sunrise and sunset")
    assert "Celery runs on days matching both" in reasons["both-days"]
    assert reasons["dynamic"].startswith("crontab(hour=...) is not written as a literal")
    assert reasons["no-task"] == "'task' is missing"
    assert reasons["add-every-10"].startswith("add_periodic_task() names its task")
    priority = next(job for job in outcome.jobs if job.definition["name"] == "priority")
    assert priority.lost == ("options priority=9: no counterpart in a job",)


def test_the_celery_config_is_read_never_run(tmp_path: Path) -> None:
    """A config whose import would write a file and exit is parsed; nothing of it runs."""
    marker = tmp_path / "ran"
    text = (
        f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(3)\n"
        "CELERYBEAT_SCHEDULE = {'nightly': {'task': 't.n', 'schedule': crontab(0, 3)}}\n"
        "app.conf.update(beat_schedule={'weekly': {'task': 't.w', 'schedule': "
        "crontab(minute=0, hour=4, day_of_week='sunday-tuesday')}}, timezone='Asia/Tokyo')\n"
    )
    jobs = jobs_of(imported(text, "celery"))
    assert not marker.exists()
    assert jobs["nightly"]["cron"] == "0 3 * * *"
    assert jobs["weekly"]["cron"] == "0 4 * * sun-tue"
    assert jobs["weekly"]["timezone"] == "Asia/Tokyo"


def test_python_that_does_not_parse_is_unreadable() -> None:
    """A syntax error is unreadable input, with its line."""
    with pytest.raises(UnreadableInput, match=r"^src:2: not Python"):
        read_source("beat_schedule = {}\ndef (:\n", "celery", "src")


# -- shared ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seconds", "cron"),
    [
        (1, "* * * * * *"), (15, "*/15 * * * * *"), (60, "* * * * *"), (300, "*/5 * * * *"),
        (3600, "0 * * * *"), (7200, "0 */2 * * *"), (86400, "0 0 * * *"), (604800, "0 0 * * 0"),
        (7, None), (90, None), (420, None), (18000, None), (172800, None), (0.5, None), (-60, None),
    ],
)  # fmt: skip
def test_an_interval_maps_only_when_it_divides_the_clock(seconds: float, cron: str | None) -> None:
    """Intervals become cron on the clock's multiples; others have no cron form."""
    assert interval_cron(seconds) == cron


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("mq.{job}", "unknown placeholder {job}"),
        ("mq.{name.upper}", "unknown placeholder {name.upper}"),
        ("mq.{name!r}", "{name} takes no conversion or format spec"),
        ("mq.{name:>9}", "{name} takes no conversion or format spec"),
        ("mq.{name", "expected '}'"),
    ],
)
def test_a_subject_template_takes_only_name(template: str, problem: str) -> None:
    """The template names what is wrong; no attribute access, conversion or format spec."""
    with pytest.raises(ValueError, match=problem.replace("{", r"\{").replace(".", r"\.")):
        check_template(template)


def test_a_subject_the_loader_refuses_skips_the_entry_with_its_message() -> None:
    """Jobs are validated as `scheduler validate` would; a refused subject says why."""
    outcome = assemble([read_source("0 1 * * * /bin/x\n", "crontab", "src")], "mq.delay.{name}")
    assert outcome.jobs == ()
    assert (
        skipped_of(outcome)["x"]
        == "subject: 'mq.delay.x' is under mq.delay., which jobs may never target"
    )
    assert load_text(render(outcome)).errors == ()


def test_the_kind_is_told_by_name_then_by_text() -> None:
    """.yaml/.yml: cronjob; .py: celery; else `kind: CronJob` or a beat schedule in the text."""
    assert detect_kind("jobs.yml", "") == "cronjob"
    assert detect_kind("celeryconfig.py", "") == "celery"
    assert detect_kind("-", "kind: CronJob\n") == "cronjob"
    assert detect_kind("-", "app.conf.beat_schedule = {}\n") == "celery"
    assert detect_kind("crontab.txt", "* * * * * x\n") == "crontab"


def test_the_zone_rules_are_those_of_the_output() -> None:
    """A fixed-time job read from a CronJob fires by this scheduler's DST rule (the gap's end)."""
    job = jobs_of(imported(CRONJOBS, "cronjob"))["report-nightly"]
    after = datetime(2027, 3, 13, 12, tzinfo=UTC)
    first = next(occurrences(CronExpr.parse(job["cron"]), after, ZoneInfo(job["timezone"])))
    assert first == datetime(2027, 3, 14, 7, tzinfo=UTC)  # 02:30 does not exist: 03:00 EDT


# -- fuzz: only UnreadableInput escapes, and what is written always loads ------------------------
FUZZ = settings(
    max_examples=100,
    deadline=timedelta(seconds=1),
    suppress_health_check=[HealthCheck.too_slow],
)
CRON_TOKENS = st.sampled_from(
    ["*", "*/5", "0", "30", "1-5", "mon-fri", "jan", "L", "15W", "5#2", "?", "99", "7", "0-6/2",
     "@daily", "@reboot", "@every", "CRON_TZ=Europe/Paris", "TZ=Nowhere/Zone", "MAILTO=", "%",
     "/bin/run", "root", "--flag", ">>", "Ünïcode", "\t", ""]
)  # fmt: skip
ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
SPEC_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "schedule": st.one_of(
            st.lists(CRON_TOKENS, min_size=1, max_size=7).map(" ".join),
            st.sampled_from(["@every 90s", "@every 1h30m", "@every 9" * 60 + "h"]),
            ANY_VALUE,
        ),
        "timeZone": st.sampled_from(["UTC", "Asia/Tokyo", "Nowhere/Zone", ""]) | ANY_VALUE,
        "concurrencyPolicy": st.sampled_from(["Allow", "Forbid", "Replace", "Never"]) | ANY_VALUE,
        "suspend": ANY_VALUE,
        "startingDeadlineSeconds": ANY_VALUE,
        "jobTemplate": ANY_VALUE,
    },
)
CELERY_SCHEDULES = st.sampled_from(
    ["crontab(minute={v})", "crontab({v}, {v}, {v}, {v}, {v})", "crontab(day_of_week={v})",
     "timedelta(minutes={v})", "timedelta({v}, {v})", "schedule({v})", "{v}", "solar({v})",
     "crontab(hour=range({v}, {v}, {v}))"]
)  # fmt: skip
CELERY_VALUES = st.sampled_from(
    ["0", "'*/15'", "'mon-fri'", "'monday'", "[0, 30]", "{1, 2}", "1e999", "-5", "10**9",
     "'L'", "x", "os.environ['A']", "True", "None", "'1-31/2'", "999999999999999999999999", "0.5"]
)  # fmt: skip


def written_loads(parsed: Parsed) -> None:
    outcome = assemble([parsed], SUBJECT)
    assert load_text(render(outcome)).errors == ()
    report(outcome)


@FUZZ
@given(st.lists(st.lists(CRON_TOKENS, max_size=8).map(" ".join), max_size=8), st.booleans())
def test_fuzzed_crontabs_are_read_or_refused_never_crash(lines: list[str], system: bool) -> None:
    """Any crontab is read: each line a job, a skipped entry or a setting."""
    written_loads(read_source("\n".join(lines), "crontab", "src", system=system))


@FUZZ
@given(
    st.lists(
        st.fixed_dictionaries(
            {"kind": st.sampled_from(["CronJob", "CronJob", "Deployment"]) | ANY_VALUE},
            optional={"metadata": st.fixed_dictionaries({}, optional={"name": ANY_VALUE}),
                      "spec": SPEC_VALUES | ANY_VALUE},
        ),
        max_size=4,
    )
)  # fmt: skip
def test_fuzzed_cronjob_manifests_are_read_or_refused_never_crash(docs: list[Any]) -> None:
    """Any manifest of CronJob-like documents is read; what is written loads."""
    text = yaml.safe_dump_all(docs)
    written_loads(read_source(text, "cronjob", "src"))


@FUZZ
@given(st.text(max_size=200))
def test_fuzzed_text_is_read_or_unreadable(text: str) -> None:
    """Random text: each reader answers, or says the input is unreadable."""
    for kind in ("crontab", "cronjob", "celery"):
        try:
            parsed = read_source(text, kind, "src")
        except UnreadableInput:
            continue
        written_loads(parsed)


@FUZZ
@given(st.lists(st.tuples(CELERY_SCHEDULES, st.lists(CELERY_VALUES, min_size=5, max_size=5))))
def test_fuzzed_celery_schedules_are_read_or_refused_never_crash(
    entries: list[tuple[str, list[str]]],
) -> None:
    """Any beat entry built of literal and non-literal parts maps or is skipped, never runs."""
    body = ",\n".join(
        f"    'e{i}': {{'task': 't', 'schedule': {pattern.replace('{v}', '{}').format(*values)}}}"
        for i, (pattern, values) in enumerate(entries)
    )
    written_loads(read_source(f"beat_schedule = {{\n{body}\n}}\n", "celery", "src"))
