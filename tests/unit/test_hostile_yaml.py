"""Hostile schedules files and durations: each is a file:line error, never a crash or a hang,
and the good jobs of the same folder still load (docs/security.md, "What the daemon refuses")."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scheduler.cron.expression import CronExpr, CronSyntaxError
from scheduler.cron.jobs import MAX_CRON_CHARS, MAX_FILE_BYTES, load_dir, load_text
from scheduler.durations import MAX_DURATION, parse_duration
from scheduler.errors import DurationError

JOB = "scheduled_jobs:\n  - name: a\n    subject: mq.scheduled.a\n    cron: '@daily'\n"
GOOD = "scheduled_jobs:\n  - name: good\n    subject: mq.scheduled.good\n    cron: '@hourly'\n"


def errors_of(text: str) -> list[str]:
    return [str(e) for e in load_text(text, "s.yaml").errors]


def bomb(levels: int = 9, width: int = 9) -> str:
    """The billion-laughs document: each anchor lists the previous one `width` times."""
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "scheduled_jobs:\n  - !!python/object/apply:os.system ['touch /tmp/pwned']\n",
            "s.yaml:2: YAML syntax error: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/object/apply:os.system'",
        ),
        (
            "scheduled_jobs: !!python/name:os.system\n",
            "s.yaml:1: YAML syntax error: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/name:os.system'",
        ),
        (
            JOB + "    data: !!python/object:collections.OrderedDict {}\n",
            "s.yaml:5: YAML syntax error: could not determine a constructor",
        ),
    ],
)
def test_python_tags_are_never_constructed(text: str, expected: str) -> None:
    """`!!python/...` tags are refused by the safe loader with file:line; nothing runs."""
    assert not Path("/tmp/pwned").exists()
    assert any(e.startswith(expected) for e in errors_of(text)), errors_of(text)
    assert not Path("/tmp/pwned").exists()


def test_an_alias_bomb_is_refused_before_it_is_expanded() -> None:
    """Nine anchors of nine aliases (387 million values) are refused in milliseconds."""
    started = time.perf_counter()
    errors = errors_of(bomb() + JOB + "    data: {k: *l8}\n")
    assert time.perf_counter() - started < 1.0
    assert errors == [
        "s.yaml:1: the document expands to more than 100000 values (aliases repeated into a bomb?)"
    ]


def test_a_recursive_alias_is_refused() -> None:
    """An anchor that contains itself is refused as nesting too deep, not followed forever."""
    assert errors_of(JOB + "    data: &r {k: *r}\n") == [
        "s.yaml:1: YAML nesting is deeper than 64 levels"
    ]


@pytest.mark.parametrize("depth", [65, 100_000])
def test_deep_nesting_is_refused(depth: int) -> None:
    """Nesting past 64 levels, and past what the parser's recursion can take, is an error."""
    errors = errors_of(JOB + "    data: {k: " + "[" * depth + "]" * depth + "}\n")
    assert len(errors) == 1 and "YAML nesting is deeper than" in errors[0]


def test_a_few_aliases_still_work() -> None:
    """Aliases and merges within the bounds load as before."""
    text = GOOD + "  - <<: &b {subject: mq.scheduled.a, cron: '@daily'}\n    name: a\n"
    found = load_text(text + "    data: {x: &x [1, 2], y: *x}\n", "s.yaml")
    assert found.errors == ()
    assert {job.name: job.data for job in found.jobs}["a"] == {"x": [1, 2], "y": [1, 2]}


def test_duplicate_keys_are_refused_at_every_level() -> None:
    """A key written twice, in a job or at the top, is an error on the second occurrence."""
    assert errors_of(JOB + "    name: b\n") == ["s.yaml:5: duplicate key 'name'"]
    assert "s.yaml:5: duplicate key 'scheduled_jobs'" in errors_of(JOB + "scheduled_jobs: []\n")


def test_a_cron_field_of_10000_characters_is_refused_by_length() -> None:
    """A cron expression longer than 1,024 characters is refused before it is parsed."""
    cron = "1," * 4999 + "1 * * * *"
    text = f"scheduled_jobs:\n  - name: a\n    subject: mq.scheduled.a\n    cron: '{cron}'\n"
    assert len(cron) >= 10_000
    assert errors_of(text) == [
        f"s.yaml:4: a: cron: is {len(cron)} characters long; at most {MAX_CRON_CHARS}"
    ]


def test_a_subject_over_1024_characters_is_refused() -> None:
    """A job's subject longer than a frame allows is refused by length."""
    text = JOB.replace("mq.scheduled.a", "mq." + "a" * 1100)
    assert errors_of(text) == ["s.yaml:3: a: subject: is 1103 characters long; at most 1024"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1" * 5000, "s.yaml:5: YAML value error: Exceeds the limit (4300 digits)"),
        ("2001-13-45", "s.yaml:5: YAML value error: month must be in 1..12"),
    ],
)
def test_scalars_the_safe_loader_cannot_build_are_errors(value: str, expected: str) -> None:
    """A 5,000-digit integer or an impossible date is a file:line error, not a crash."""
    errors = errors_of(JOB + f"    data: {{v: {value}}}\n")
    assert len(errors) == 1 and errors[0].startswith(expected), errors


@pytest.mark.parametrize("jitter", ["1e20", "99999999999999999999d", ".inf", ".nan", "-1s"])
def test_durations_out_of_range_are_errors_not_crashes(jitter: str) -> None:
    """A jitter past 100 years, infinite, NaN or negative names the key; it never raises."""
    errors = errors_of(JOB + f"    jitter: {jitter}\n")
    assert len(errors) == 1 and errors[0].startswith("s.yaml:5: a: jitter: "), errors


def test_a_100_mb_file_is_refused_unread_and_the_other_files_load(tmp_path: Path) -> None:
    """A schedules file over 1 MiB is refused by its size without being read; the jobs of
    the folder's other files still load."""
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: 100 MB on paper, nothing on disk
    (tmp_path / "good.yaml").write_text(GOOD)
    started = time.perf_counter()
    found = load_dir(tmp_path)
    assert time.perf_counter() - started < 1.0
    assert [job.name for job in found.jobs] == ["good"]
    assert [str(e) for e in found.errors] == [
        f"{huge}: the file is {100 * 1024 * 1024} bytes long; at most {MAX_FILE_BYTES}"
    ]


def test_text_over_the_file_limit_is_refused() -> None:
    """load_text applies the same bound to text it is given."""
    assert errors_of(JOB + "#" * MAX_FILE_BYTES) == [
        f"s.yaml: the file is {len(JOB) + MAX_FILE_BYTES} characters long; at most {MAX_FILE_BYTES}"
    ]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("1e400", "is longer than 100 years"),
        (10**400, "is longer than 100 years"),
        (float("inf"), "is longer than 100 years"),
        ("nan", "is not a duration"),
        (float("nan"), "is not a duration"),
        ("36501d", "is longer than 100 years"),
        ("1" * 100_000 + "x", "is not a duration"),
    ],
)
def test_durations_out_of_range_raise_duration_error(value: object, problem: str) -> None:
    """Out-of-range or unreadable durations raise DurationError (a ValueError) whose message
    stays short however long the input."""
    with pytest.raises(DurationError) as info:
        parse_duration(value)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert str(info.value).endswith(problem) or problem in str(info.value)
    assert len(str(info.value)) < 200


def test_the_longest_duration_is_accepted() -> None:
    """100 years exactly is still a duration."""
    assert parse_duration("36500d") == MAX_DURATION


def test_a_control_character_in_the_file_is_an_error_with_its_line() -> None:
    """PyYAML refuses control characters while opening the text: a file:line error too."""
    assert errors_of(JOB + "# \x08\n") == [
        "s.yaml:5: YAML syntax error: character #x0008 is not allowed"
    ]


@pytest.mark.parametrize(
    ("cron", "problem"),
    [
        ("\u00b2 * * * *", "'\u00b2' is not a number"),  # "²".isdigit() is True, int() fails
        ("*/\u0663 * * * *", "must be a whole number >= 1"),  # an Arabic-Indic three
        ("9" * 5000 + " * * * *", "value out of range 0-59"),  # int() of 5,000 digits raises
        ("*/" + "9" * 5000 + " * * * *", "must be a whole number >= 1"),
    ],
)
def test_cron_numbers_that_are_not_plain_ascii_digits_are_syntax_errors(
    cron: str, problem: str
) -> None:
    """Unicode digits and numbers too long to convert are CronSyntaxError (found by fuzzing)."""
    with pytest.raises(CronSyntaxError, match=problem):
        CronExpr.parse(cron)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("    data: {t: !!timestamp x}\n", "s.yaml:5: YAML value error: a timestamp cannot be"),
        ("    data: {? !!set {a}: 1}\n", "s.yaml:5: YAML syntax error: found unhashable key"),
    ],
)
def test_tags_forced_onto_the_wrong_scalar_are_errors(line: str, expected: str) -> None:
    """A `!!timestamp` on a non-date and a set used as a key are file:line errors (found by
    fuzzing: they raised AttributeError and TypeError from inside the loader)."""
    errors = errors_of(JOB + line)
    assert len(errors) == 1 and errors[0].startswith(expected), errors
