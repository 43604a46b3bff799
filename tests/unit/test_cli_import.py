"""`scheduler schedules import` end to end: what it writes passes `scheduler validate`, and
`scheduler next` shows the occurrences the sources meant; the exit status tells all mapped,
some skipped and unreadable apart."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from scheduler.cli.main import main

CRONTAB = """\
CRON_TZ=America/New_York
30 2 * * * /opt/backup/backup.sh full
*/20 * * * 1-5 /usr/local/bin/sync-users
"""
CRONTAB_WITH_REBOOT = CRONTAB + "@reboot /usr/local/bin/warm-cache\n"
CRONJOB = """\
apiVersion: batch/v1
kind: CronJob
metadata: {name: report.nightly, namespace: analytics}
spec:
  schedule: "0 6 1 * *"
  timeZone: Europe/Berlin
  concurrencyPolicy: Forbid
  suspend: true
"""
SUBJECT = "mq.scheduled.{name}"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_imported_jobs_validate_and_fire_when_the_sources_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crontab and a CronJob file import into one file that validates; `next` shows the
    crontab's New York times across the spring-forward night and the CronJob's Berlin time."""
    (tmp_path / "crontab").write_text(CRONTAB)
    (tmp_path / "jobs.yaml").write_text(CRONJOB)
    out = tmp_path / "schedules" / "imported.yaml"
    out.parent.mkdir()
    code, stdout, err = run(
        capsys,
        *("schedules", "import", str(tmp_path / "crontab"), str(tmp_path / "jobs.yaml")),
        *("--subject", SUBJECT, "--out", str(out)),
    )
    assert code == 0, err
    assert stdout == ""
    assert (
        err.splitlines()[-1] == f"imported 3 of 3 entries to {out}: 0 skipped, 0 not fully mapped"
    )
    code, stdout, err = run(capsys, "validate", str(out.parent))
    assert (code, stdout, err) == (0, "3 jobs OK in 1 file\n", "")
    after = ("--after", "2027-03-12T12:00:00Z", "--count", "3", "--json")
    code, stdout, _ = run(capsys, "next", str(out.parent), *after)
    assert code == 0
    assert json.loads(stdout) == {
        "backup-sh-full": ["2027-03-13T07:30:00Z", "2027-03-14T07:00:00Z", "2027-03-15T06:30:00Z"],
        "report-nightly": ["2027-04-01T04:00:00Z", "2027-05-01T04:00:00Z", "2027-06-01T04:00:00Z"],
        "sync-users": ["2027-03-12T12:20:00Z", "2027-03-12T12:40:00Z", "2027-03-12T13:00:00Z"],
    }
    code, stdout, _ = run(capsys, "next", str(out.parent), "--name", "report-nightly")
    assert (
        "report-nightly  0 6 1 * *  (Europe/Berlin) -> mq.scheduled.report-nightly  [paused]"
        in (stdout)
    )


def test_some_skipped_exits_1_and_still_writes_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An @reboot entry read from stdin is reported and left out; the YAML on stdout holds the
    others and validates."""
    monkeypatch.setattr("sys.stdin", io.StringIO(CRONTAB_WITH_REBOOT))
    code, stdout, err = run(capsys, "schedules", "import", "-", "--subject", SUBJECT)
    assert code == 1
    assert "<stdin>:4: warm-cache: skipped: @reboot runs once when cron starts" in err
    assert err.splitlines()[-1] == "imported 2 of 3 entries: 1 skipped, 0 not fully mapped"
    (tmp_path / "imported.yaml").write_text(stdout)
    assert run(capsys, "validate", str(tmp_path))[0] == 0


def test_a_part_not_mapped_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CronJob with concurrencyPolicy Replace is written, reported as not fully mapped."""
    source = tmp_path / "replace.yml"
    source.write_text(CRONJOB.replace("Forbid", "Replace"))
    code, stdout, err = run(capsys, "schedules", "import", str(source), "--subject", SUBJECT)
    assert code == 1
    assert "report-nightly: not mapped: concurrencyPolicy Replace" in err
    assert "# not mapped: concurrencyPolicy Replace" in stdout


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("missing.yaml", None, "missing.yaml: No such file or directory"),
        ("bad.yaml", "kind: CronJob\nspec: [\n", "bad.yaml:3: not YAML"),
        ("bad.py", "beat_schedule = {\n", "bad.py:1: not Python"),
        ("binary", b"\xff\xfe\x00", "binary: not UTF-8 text (byte 0)"),
    ],
)
def test_unreadable_input_exits_2_and_writes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    text: str | bytes | None,
    message: str,
) -> None:
    """An input that cannot be read stops the import before anything is written."""
    source, out = tmp_path / name, tmp_path / "out.yaml"
    if isinstance(text, bytes):
        source.write_bytes(text)
    elif text is not None:
        source.write_text(text)
    code, stdout, err = run(
        capsys, "schedules", "import", str(source), "--subject", SUBJECT, "--out", str(out)
    )
    assert code == 2
    assert message in err and err.startswith("scheduler: schedules import: ")
    assert stdout == "" and not out.exists()


def test_an_existing_out_file_needs_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out never overwrites by surprise; --force does."""
    source, out = tmp_path / "crontab", tmp_path / "out.yaml"
    source.write_text(CRONTAB)
    out.write_text("keep me")
    argv = ("schedules", "import", str(source), "--subject", SUBJECT, "--out", str(out))
    code, _, err = run(capsys, *argv)
    assert code == 2 and "exists (pass --force to overwrite it)" in err
    assert out.read_text() == "keep me"
    assert run(capsys, *argv, "--force")[0] == 0
    assert "backup-sh-full" in out.read_text()
    elsewhere = str(tmp_path / "nowhere" / "out.yaml")
    code, _, err = run(capsys, *argv[:-1], elsewhere)
    assert code == 2 and f"folder {tmp_path / 'nowhere'} does not exist" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--subject", "mq.{job}"), "argument --subject: unknown placeholder {job}"),
        (("--subject", SUBJECT, "--timezone", "Mars/Olympus"), "unknown time zone 'Mars/Olympus'"),
        (("--subject", SUBJECT, "--from", "quartz"), "argument --from: invalid choice"),
    ],
)
def test_wrong_arguments_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    """A bad template, zone or format is refused by argparse with the flag's name."""
    with pytest.raises(SystemExit) as info:
        main(["schedules", "import", str(tmp_path / "crontab"), *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_help_names_the_guide_and_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    """`scheduler schedules import --help` points at docs/migrating.md, which exists."""
    with pytest.raises(SystemExit) as info:
        main(["schedules", "import", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "docs/migrating.md" in text and "Exit status: 0 every entry mapped; 1 some" in text
    assert (Path(__file__).resolve().parents[2] / "docs" / "migrating.md").is_file()
