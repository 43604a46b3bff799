"""How the operator CLI finds the daemon and its token (the dev daemon's `api.json`), and what
it says when the answer is not the daemon's or a token is missing."""

from __future__ import annotations

import http.server
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from scheduler.cli.apiclient import DEFAULT_URL, UNAVAILABLE, ApiClient, ApiFailure
from scheduler.cli.main import main, print_banner
from scheduler.daemon import dev_access
from scheduler.daemon.dev_access import DevAccess
from scheduler.daemon.embedded import free_port, publish_dev_access, with_dev_tokens
from scheduler.settings import Settings

ADMIN = "dev-admin-" + "a" * 32
READ = "dev-read-" + "r" * 32


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder to run the CLI from, with none of the caller's SCHEDULER_* variables."""
    for name in list(os.environ):
        if name.startswith("SCHEDULER_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def dev_file(folder: Path, url: str = "http://127.0.0.1:41234", pid: int | None = None) -> Path:
    path = folder / ".scheduler-data" / "api.json"
    access = DevAccess(url=url, admin_token=ADMIN, read_token=READ, pid=pid or os.getpid())
    dev_access.write(path, access)
    return path


def test_no_url_reads_the_dev_daemons_file(here: Path) -> None:
    """Without --url or SCHEDULER_API_URL the CLI takes URL and admin token from
    .scheduler-data/api.json."""
    dev_file(here)
    client = ApiClient.from_args(None, None, 5)
    assert client.url == "http://127.0.0.1:41234" and client.token == ADMIN
    assert client.url_from == client.token_from == ".scheduler-data/api.json"


def test_data_dir_variable_names_where_the_file_is(
    here: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SCHEDULER_DATA_DIR moves the file the CLI reads, as it moves the daemon's data."""
    elsewhere = tmp_path_factory.mktemp("data")
    dev_access.write(elsewhere / "api.json", DevAccess(url="http://127.0.0.1:5", pid=1))
    monkeypatch.setenv("SCHEDULER_DATA_DIR", str(elsewhere))
    assert ApiClient.from_args(None, None, 5).url == "http://127.0.0.1:5"


def test_the_files_token_goes_only_to_its_own_url(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An explicit URL wins over the file; the file's token is sent to its own URL only."""
    dev_file(here)
    same = ApiClient.from_args("http://127.0.0.1:41234/", None, 5)
    assert same.token == ADMIN
    other = ApiClient.from_args("http://10.0.0.7:8055", None, 5)
    assert other.url == "http://10.0.0.7:8055" and other.token is None
    monkeypatch.setenv("SCHEDULER_API_URL", "http://127.0.0.1:9999")
    assert ApiClient.from_args(None, None, 5).token is None


def test_tokens_given_win_over_the_file(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--token, then SCHEDULER_ADMIN_TOKEN, then SCHEDULER_READ_TOKEN come before the file."""
    dev_file(here)
    monkeypatch.setenv("SCHEDULER_READ_TOKEN", "from-read-env")
    assert ApiClient.from_args(None, None, 5).token_from == "SCHEDULER_READ_TOKEN"
    monkeypatch.setenv("SCHEDULER_ADMIN_TOKEN", "from-admin-env")
    assert ApiClient.from_args(None, None, 5).token == "from-admin-env"
    assert ApiClient.from_args(None, "flag", 5).token_from == "--token"


def test_without_file_or_variables_the_default_url_and_no_token(here: Path) -> None:
    """No file, no variable: http://127.0.0.1:8055 and no token, as before."""
    client = ApiClient.from_args(None, None, 5)
    assert (client.url, client.token) == (DEFAULT_URL, None)


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b'{"url": "ftp://x", "admin_token": "short", "pid": true}',
        b'{"url": "http://127.0.0.1:1", "admin_token": "' + b"x" * 20_000 + b'"}',
        b"[1, 2]",
    ],
    ids=["garbage", "bad-fields", "oversize", "not-an-object"],
)
def test_a_file_that_is_not_ours_sends_nothing(here: Path, content: bytes) -> None:
    """A damaged or foreign api.json gives no URL and no token (never a traceback)."""
    path = here / ".scheduler-data" / "api.json"
    path.parent.mkdir()
    path.write_bytes(content)
    client = ApiClient.from_args(None, None, 5)
    assert (client.url, client.token) == (DEFAULT_URL, None)


def test_the_file_is_private(tmp_path: Path) -> None:
    """api.json is written 0600, even over a file that was readable by others."""
    path = tmp_path / "api.json"
    path.write_text("{}")
    path.chmod(0o644)
    publish_dev_access(
        tmp_path, "http://127.0.0.1:8055", DevAccess(admin_token=ADMIN, read_token=READ)
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert dev_access.read(path) == DevAccess("http://127.0.0.1:8055", ADMIN, READ, os.getpid())


def test_dev_tokens_are_made_once_per_data_dir(tmp_path: Path) -> None:
    """Embedded mode without tokens makes an admin and a read token, and the next start on the
    same data dir keeps them (exported tokens and console sign-ins stay valid)."""
    settings = Settings(data_dir=tmp_path)
    first, tokens = with_dev_tokens(settings)
    assert tokens is not None and tokens.admin_token and tokens.read_token
    assert tokens.admin_token != tokens.read_token
    assert first.admin_token is not None
    assert first.admin_token.get_secret_value() == tokens.admin_token
    assert "http_port" not in first.model_fields_set  # a taken default port may still move
    publish_dev_access(tmp_path, "http://127.0.0.1:8055", tokens)
    _, again = with_dev_tokens(settings)
    assert again == tokens


def test_tokens_of_the_users_own_are_kept_and_never_written(tmp_path: Path) -> None:
    """A daemon given SCHEDULER_ADMIN_TOKEN keeps it, and api.json holds the URL only."""
    settings = Settings(data_dir=tmp_path, admin_token="mine-mine-mine-mine")
    same, tokens = with_dev_tokens(settings)
    assert tokens is None and same is settings
    path = publish_dev_access(tmp_path, "http://127.0.0.1:8055", tokens)
    assert "mine" not in path.read_text()
    assert dev_access.read(path) == DevAccess(url="http://127.0.0.1:8055", pid=os.getpid())


class _NotOurs(http.server.BaseHTTPRequestHandler):
    """What another program on the port might answer: HTML, for any path."""

    def do_GET(self) -> None:
        body = b"<html>File not found</html>"
        self.send_response(404 if "v1" in self.path else 200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:  # quiet: pytest would show it
        pass


@pytest.fixture
def foreign_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotOurs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_another_program_on_the_port_is_named_as_such(
    here: Path, foreign_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An answer that is not the API's problem JSON says another program listens there
    (exit 3), instead of printing that program's error as the daemon's."""
    assert main(["status", "--url", foreign_server]) == UNAVAILABLE
    err = capsys.readouterr().err
    assert "is not mq-scheduler's management API" in err and "HTTP 404 (text/html)" in err
    assert "SCHEDULER_API_URL" in err
    with pytest.raises(ApiFailure) as ok_status:
        ApiClient(foreign_server, None).call("GET", "/")  # a 200 that is not JSON either
    assert ok_status.value.exit_code == UNAVAILABLE
    assert "not mq-scheduler's" in str(ok_status.value)


def test_a_stopped_dev_daemon_is_named(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """When the daemon that wrote api.json is gone, the CLI says so and how to start it."""
    dev_file(here, url=f"http://127.0.0.1:{free_port()}", pid=_ended_pid())
    assert main(["delayed", "list"]) == UNAVAILABLE
    err = capsys.readouterr().err
    assert "URL from .scheduler-data/api.json" in err and "has stopped" in err
    assert "scripts/dev" in err


def _ended_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(10)
    return child.pid


def _daemon(settings: Settings) -> SimpleNamespace:
    served = SimpleNamespace(url="http://127.0.0.1:41234")
    endpoints = SimpleNamespace(
        nats_url="nats://127.0.0.1:4333",
        database_url="postgresql://x",
        api=served,
        metrics=SimpleNamespace(url="http://127.0.0.1:9999"),
        embedded=["nats", "postgres"],
    )
    return SimpleNamespace(endpoints=endpoints, settings=settings)


def test_dev_banner_has_one_export_line_and_the_console(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The dev banner names the console's URL and how to sign in, and one export line sets
    SCHEDULER_API_URL (the variable the CLI reads), the dev admin token and NATS_URL."""
    tokens = DevAccess(admin_token=ADMIN, read_token=READ)
    print_banner(_daemon(Settings()), tokens, Path(".scheduler-data/api.json"))
    out = capsys.readouterr().out
    exports = [line for line in out.splitlines() if line.lstrip().startswith("export ")]
    assert len(exports) == 1
    words = dict(word.split("=", 1) for word in exports[0].split()[1:])
    assert words["SCHEDULER_API_URL"] == "http://127.0.0.1:41234"
    assert words["SCHEDULER_ADMIN_TOKEN"] == ADMIN and READ not in out
    assert words["NATS_URL"] == "nats://127.0.0.1:4333"
    assert "SCHEDULER_API=" not in out
    assert "console     http://127.0.0.1:41234/ui/  (sign in with SCHEDULER_ADMIN_TOKEN" in out
    assert "(.scheduler-data/api.json)" in out


def test_a_banner_never_prints_tokens_the_user_set(capsys: pytest.CaptureFixture[str]) -> None:
    """Outside dev mode (or with tokens of the user's own) no token is printed."""
    print_banner(_daemon(Settings(admin_token="mine-mine-mine-mine")))
    out = capsys.readouterr().out
    assert "mine" not in out and "SCHEDULER_ADMIN_TOKEN=" not in out
    assert "sign in with SCHEDULER_ADMIN_TOKEN or SCHEDULER_READ_TOKEN" in out
