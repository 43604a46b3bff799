"""Settings from `SCHEDULER_*` environment variables and an optional YAML config file.

The environment wins over the file (`SCHEDULER_CONFIG` or `--config` names it; its keys are the
variable names without the prefix, in lower case). A wrong value fails at start with a message
naming the variable. Secrets never appear in `repr` or logs.
"""

from __future__ import annotations

import os
import re
import socket
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

from pydantic import (
    ByteSize,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from scheduler.durations import parse_duration
from scheduler.errors import ConfigError
from scheduler.partitions import MAX_PARTITIONS

ENV_PREFIX = "SCHEDULER_"
CONFIG_ENV = "SCHEDULER_CONFIG"

Duration = Annotated[timedelta, Field()]
MAX_DISPATCH_COALESCE = timedelta(milliseconds=100)
CommaList = Annotated[list[str], NoDecode]
OrgShares = Annotated[dict[str, int], NoDecode]
# SCHEDULER_API_ALLOWED_HOSTS entries: `*`, a name, `*.<domain>`, an IPv4 or IPv6 address
_HOST_PATTERN = re.compile(
    r"\*|(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*|[0-9a-f.]*:[0-9a-f.]*:[0-9a-f:.]*"
)

_DURATION_FIELDS = (
    "horizon",
    "backoff",
    "campaign_interval",
    "fence_margin",
    "intake_ack_wait",
    "max_delay",
    "shutdown_grace",
    "dlq_max_age",
    "intake_duplicate_window",
    "max_clock_skew",
    "dispatch_coalesce",
    "startup_timeout",
    "forecast_interval",
    "ui_session_ttl",
    "api_statement_timeout",
    "intent_ttl",
    "activity_retention",
    "metrics_export_interval",
    "api_header_timeout",
    "api_body_timeout",
    "api_idle_timeout",
)


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Every knob of the daemon; each one and its default in README.md, "Configuration"."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", validate_default=True, frozen=True
    )

    nats_url: str | None = None
    nats_creds: Path | None = None
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_token: SecretStr | None = None
    nats_nkey_seed: SecretStr | None = None
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    database_url: SecretStr | None = None
    database_password_file: Path | None = None
    schedules_dir: Path = Path("schedules")
    instance_id: str = Field(default_factory=_default_instance_id, min_length=1)
    lease_ttl: float = Field(default=5.0, gt=0)
    # a NATS link whose server answers no PING for this long is left for another node
    # (bus/nats/link.py); 0 leaves it to nats-py's own pings (4-6 s)
    nats_stale_after: float = Field(default=1.0, ge=0)
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8055, ge=0, le=65535)
    metrics_port: int = Field(default=9090, ge=0, le=65535)
    admin_token: SecretStr | None = None
    read_token: SecretStr | None = None
    # the HTTP edge (api/edge.py): request bodies at most this big; Host names served
    api_max_body: ByteSize = Field(default=ByteSize(1024 * 1024), ge=1)
    api_allowed_hosts: CommaList = []
    # the HTTP edge's deadlines (api/deadlines.py, api/edge.py): a request's head, its body, and
    # an idle keep-alive connection
    api_header_timeout: Duration = Field(default=timedelta(seconds=10), gt=timedelta(0))
    api_body_timeout: Duration = Field(default=timedelta(seconds=10), gt=timedelta(0))
    api_idle_timeout: Duration = Field(default=timedelta(seconds=5), ge=timedelta(seconds=1))
    # socket reads the HTTP listeners handle per second, all connections together (api/pace.py)
    api_max_reads_per_second: int = Field(default=500, ge=0, le=1_000_000)
    # connections they accept per second, and hold open at once (api/deadlines.py)
    api_max_connections_per_second: int = Field(default=100, ge=0, le=1_000_000)
    api_max_connections: int = Field(default=500, ge=1, le=1_000_000)
    intake_stream: str = Field(default="MQ_DELAY", min_length=1)
    intake_subject: str = "mq.delay.>"
    intake_consumer: str = "scheduler-intake"
    intake_ack_wait: Duration = timedelta(seconds=10)
    # deprecated, ignored (a warning at start when set): the delay lane keeps no duplicate window
    # on nats-server 2.14+, 100 ms before (scheduler.bus.nats.connection.lane_config)
    intake_duplicate_window: Duration | None = None
    # cancel/reschedule intents for tasks still on the delay lane (store/postgres/intents.py)
    intent_ttl: Duration = timedelta(hours=24)
    intent_max_per_target: int = Field(default=10_000, ge=1, le=10_000_000)
    intent_max_per_org: int = Field(default=50_000, ge=1, le=100_000_000)
    intent_max_total: int = Field(default=100_000, ge=1, le=100_000_000)
    target_allow: CommaList = ["mq.>"]
    provision: bool = True
    horizon: Duration = timedelta(minutes=5)
    # the horizon heap's bounds besides time (engine/delayed/horizon.py): entries, and their
    # bytes; past them the loader waits and the heap gives up its latest tasks to PostgreSQL
    horizon_max_tasks: int = Field(default=200_000, ge=10, le=50_000_000)
    horizon_max_bytes: ByteSize = Field(
        default=ByteSize(64 * 1024 * 1024), ge=64 * 1024, le=16 * 1024**3
    )
    # while an overdue backlog drains (engine/delayed/horizon.py, `Catchup`): `due_order` takes
    # every task in firing order; `on_time_first` claims what falls due now first and gives the
    # backlog (tasks overdue by over a second when it formed) this share of each claim
    catchup: Literal["due_order", "on_time_first"] = "due_order"
    catchup_backlog_share: float = Field(default=0.5, gt=0.0, le=1.0)
    batch: int = Field(default=1000, ge=1, le=100_000)
    # the deployment's partition count (scheduler/partitions.py), recorded in PostgreSQL by
    # migration 0022; an engine started with another count refuses to start
    # (store/postgres/partitioning.py); `scheduler partitions set` changes the recorded count
    partitions: int = Field(default=1, ge=1, le=MAX_PARTITIONS)
    max_attempts: int = Field(default=5, ge=1, le=1000)
    backoff: Duration = timedelta(seconds=1)
    campaign_interval: Duration = timedelta(seconds=0.5)
    fence_margin: Duration | None = None
    fire_log_retention: int = Field(default=14, ge=1)
    # 10,000: a burst of 100,000 drains as fast as with 20,000 (30,148-32,563/s against
    # 27,954-29,125, bench/README.md host P), and a million due at one instant stays under
    # 200 MB of RSS through intake (190 MB against 202)
    armed_max: int = Field(default=10_000, ge=1)
    armed_max_bytes: ByteSize = ByteSize(64 * 1024 * 1024)
    max_clock_skew: Duration = timedelta(milliseconds=100)
    # publishes of due tasks at least this far apart (engine/delayed/dispatch.py:
    # `Firing._dispatch`)
    dispatch_coalesce: Duration = timedelta(0)
    # how the leader's publisher sends (scheduler.bus.nats): `wire` frames messages itself
    # (bus/nats/publisher.py), `nats_py` goes through nats-py's public API (bus/nats/plain.py)
    publish_path: Literal["wire", "nats_py"] = "wire"
    max_delay: Duration = timedelta(days=400)
    dlq_stream: str = "MQ_DLQ"
    dlq_subject_prefix: str = "mq.dlq"
    dlq_max_age: Duration = timedelta(days=14)
    # dead letters in PostgreSQL (engine/delayed/dead_budget.py): the bytes kept of an intake
    # refusal,
    # and the refusals one organisation (or subject) may add per minute (0: no bound)
    dead_letter_payload_cap: ByteSize = Field(
        default=ByteSize(64 * 1024), ge=0, le=16 * 1024 * 1024
    )
    dead_letter_rate: int = Field(default=60, ge=0, le=1_000_000)
    tasks_stream: str = "MQ_TASKS"
    # replicas of every stream and KV bucket the daemon provisions (3 on a production cluster;
    # `scheduler provision --replicas N` moves existing ones; scheduler/bus/nats/replicas.py)
    stream_replicas: int = Field(default=1, ge=1, le=5)
    leader_bucket: str = "scheduler_leader"
    state_bucket: str = "scheduler_state"
    data_dir: Path = Path(".scheduler-data")
    # the two roles (docs/architecture.md "Two roles"): the folder an engine writes its
    # status and metrics to for the edge beside it, and how often it renders its metrics there
    run_dir: Path | None = None
    edge_nice: int = Field(default=10, ge=0, le=19)
    metrics_export_interval: Duration = Field(
        default=timedelta(seconds=5), ge=timedelta(milliseconds=100), le=timedelta(minutes=5)
    )
    shutdown_grace: Duration = timedelta(seconds=20)
    startup_timeout: Duration = timedelta(seconds=60)
    allow_unsafe_nats: bool = False
    forecast_top: int = Field(default=20, ge=1, le=1000)
    # per-org quotas and fair firing (engine/delayed/quota.py, engine/delayed/fairness.py)
    org_max_pending: int = Field(default=0, ge=0)
    org_shares: OrgShares = {}
    org_metric_labels: int = Field(default=20, ge=0, le=1000)
    fair_firing: bool = False
    forecast_interval: Duration = timedelta(seconds=5)
    # the management API's own PostgreSQL pool and its bounds (docs/operations.md)
    api_pool_size: int = Field(default=3, ge=1, le=100)
    api_statement_timeout: Duration = Field(default=timedelta(seconds=5), gt=timedelta(0))
    api_max_concurrent: int = Field(default=8, ge=1, le=1000)
    api_read_rows_per_second: int = Field(default=10_000, ge=0, le=10_000_000)
    audit_dir: Path | None = None
    ui_session_ttl: Duration = Field(default=timedelta(hours=12), gt=timedelta(0))
    # operator actions in `activity_log` (scheduler/api/activity.py), pruned hourly past this
    activity_retention: Duration = Field(default=timedelta(days=90), gt=timedelta(0))
    # count bounds beside the age bounds, enforced by the hourly upkeep (oldest rows first)
    activity_max_rows: int = Field(default=1_000_000, ge=1, le=1_000_000_000)
    idempotency_max_keys: int = Field(default=100_000, ge=1, le=1_000_000_000)
    ui_secure_cookie: bool = False
    log_level: str = "INFO"
    log_format: str = Field(default="text", pattern="^(text|json)$")
    # read from SCHEDULER_DATABASE_PASSWORD_FILE once, at load
    _database_password: SecretStr | None = PrivateAttr(default=None)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config = os.environ.get(CONFIG_ENV)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if config:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config))
        return tuple(sources)

    @field_validator(*_DURATION_FIELDS, mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)

    @field_validator("dispatch_coalesce", mode="after")
    @classmethod
    def _dispatch_coalesce(cls, value: timedelta) -> timedelta:
        if value > MAX_DISPATCH_COALESCE:
            raise ValueError("must be at most 100ms (a due task may be held back that long)")
        return value

    @field_validator("api_statement_timeout", mode="after")
    @classmethod
    def _api_statement_timeout(cls, value: timedelta) -> timedelta:
        if value < timedelta(milliseconds=1):
            raise ValueError("must be at least 1ms (PostgreSQL counts whole milliseconds)")
        return value

    @field_validator("intent_ttl", mode="after")
    @classmethod
    def _intent_ttl(cls, value: timedelta) -> timedelta:
        if not timedelta(minutes=1) <= value <= timedelta(days=30):
            raise ValueError(
                "must be between 1m and 30d (how long a cancel waits for a task still on "
                "the delay lane)"
            )
        return value

    @field_validator("target_allow", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",")]
        if isinstance(value, list) and not [p for p in value if p]:
            raise ValueError("needs at least one subject pattern")
        return [p for p in value if p] if isinstance(value, list) else value

    @field_validator("api_allowed_hosts", mode="before")
    @classmethod
    def _allowed_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list):
            return value
        names = [str(part).strip().lower().strip("[]").rstrip(".") for part in value]
        for name in names:
            if name and not _HOST_PATTERN.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a host name, an address, '*.<domain>' or '*' "
                    "(no scheme, port or path)"
                )
        return [n for n in names if n]

    @field_validator("org_shares", mode="before")
    @classmethod
    def _org_shares(cls, value: Any) -> Any:
        """`acme=3,beta=1`: each named org's weight in fair firing (others weigh 1)."""
        if not isinstance(value, str):
            return value
        shares: dict[str, int] = {}
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            org, eq, weight = part.partition("=")
            if not eq or not org.strip() or not weight.strip().isdigit():
                raise ValueError(f"{part!r} is not org=weight (a whole number, like acme=3)")
            if not 1 <= int(weight) <= 1000:
                raise ValueError(f"{part!r}: the weight must be between 1 and 1000")
            shares[org.strip()] = int(weight)
        return shares

    @field_validator("database_url", mode="after")
    @classmethod
    def _database_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            _check_postgres_url(value.get_secret_value())
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: Any) -> Any:
        levels = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
        if str(value).upper() not in levels:
            raise ValueError(f"must be one of {', '.join(sorted(levels))}")
        return str(value).upper()

    @field_validator(
        "nats_creds", "nats_tls_ca", "nats_tls_cert", "nats_tls_key", "database_password_file"
    )
    @classmethod
    def _readable_file(cls, value: Path | None) -> Path | None:
        if value is not None and not os.access(value, os.R_OK):
            problem = "no such file" if not value.exists() else "not readable by this process"
            raise ValueError(f"{problem}: {str(value)!r}")
        if value is not None and not value.is_file():
            raise ValueError(f"not a file: {str(value)!r}")
        return value

    @field_validator("nats_creds")
    @classmethod
    def _creds_file(cls, value: Path | None) -> Path | None:
        # nats-py fails inside its connect with a TypeError on a file that lacks either part
        if value is not None:
            text = value.read_text(errors="replace")
            if not (_CREDS_JWT.search(text) and _SEED.search(text)):
                raise ValueError(
                    "not a NATS credentials file: it needs the user's JWT and NKey seed blocks, "
                    "as `nsc generate creds` writes them"
                )
        return value

    @field_validator("nats_nkey_seed")
    @classmethod
    def _nkey_seed(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            nkey_seed(value)  # raises ValueError naming the problem, never the seed
        return value

    @model_validator(mode="after")
    def _nats_credentials(self) -> Settings:
        given = [
            name
            for name, value in (
                ("SCHEDULER_NATS_USER/_PASSWORD", self.nats_user or self.nats_password),
                ("SCHEDULER_NATS_TOKEN", self.nats_token),
                ("SCHEDULER_NATS_NKEY_SEED", self.nats_nkey_seed),
                ("SCHEDULER_NATS_CREDS", self.nats_creds),
            )
            if value
        ]
        if len(given) > 1:
            raise ValueError(
                f"{given[-1].split('/')[0]}: set one way to authenticate to NATS, not "
                f"{' and '.join(given)}"
            )
        if bool(self.nats_tls_cert) != bool(self.nats_tls_key):
            missing = "SCHEDULER_NATS_TLS_KEY" if self.nats_tls_cert else "SCHEDULER_NATS_TLS_CERT"
            raise ValueError(
                f"{missing}: not set; SCHEDULER_NATS_TLS_CERT and SCHEDULER_NATS_TLS_KEY go "
                "together (a client certificate and its private key)"
            )
        return self

    @model_validator(mode="after")
    def _read_database_password(self) -> Settings:
        file = self.database_password_file
        if file is None:
            return self
        if self.database_url is not None and not urlsplit(self.database_dsn or "").username:
            raise ValueError(
                "SCHEDULER_DATABASE_PASSWORD_FILE: SCHEDULER_DATABASE_URL names no user for the "
                "password (postgresql://user@host/db)"
            )
        if self.database_url is not None and urlsplit(self.database_dsn or "").password:
            raise ValueError(
                "SCHEDULER_DATABASE_PASSWORD_FILE: is set and SCHEDULER_DATABASE_URL has a "
                "password too; give the password in one place"
            )
        password = file.read_text().rstrip("\r\n")
        if not password:
            raise ValueError(f"SCHEDULER_DATABASE_PASSWORD_FILE: {str(file)!r} is empty")
        self._database_password = SecretStr(password)
        return self

    @model_validator(mode="after")
    def _api_bound(self) -> Settings:
        if self.api_max_concurrent < self.api_pool_size:
            raise ValueError(
                "SCHEDULER_API_MAX_CONCURRENT: must be at least SCHEDULER_API_POOL_SIZE "
                f"({self.api_pool_size}); connections past the bound would never be used"
            )
        return self

    @model_validator(mode="after")
    def _margin(self) -> Settings:
        if self.fence_margin is not None and self.fence_margin.total_seconds() >= self.lease_ttl:
            raise ValueError("SCHEDULER_FENCE_MARGIN: must be shorter than SCHEDULER_LEASE_TTL")
        return self

    # -- derived values -------------------------------------------------------------------------
    @property
    def effective_fence_margin(self) -> float:
        """Self-fence margin in seconds: the setting, or max(0.5 s, TTL/5)."""
        if self.fence_margin is not None:
            return self.fence_margin.total_seconds()
        return max(0.5, self.lease_ttl / 5)

    @property
    def nats_servers(self) -> list[str]:
        return [u.strip() for u in (self.nats_url or "").split(",") if u.strip()]

    @property
    def database_dsn(self) -> str | None:
        """The PostgreSQL URL in the plain `postgresql://` form asyncpg takes."""
        if self.database_url is None:
            return None
        url = self.database_url.get_secret_value()
        dsn = "postgresql://" + url.split("://", 1)[1]
        password = self._database_password
        return dsn if password is None else with_password(dsn, password.get_secret_value())

    @property
    def redacted_database_url(self) -> str | None:
        return None if self.database_dsn is None else redact_url(self.database_dsn)

    @property
    def redacted_nats_url(self) -> str:
        """The NATS URL(s) with passwords and tokens replaced by ***."""
        return ",".join(redact_url(url, token=True) for url in self.nats_servers)

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields replaced (validated again)."""
        data = {k: getattr(self, k) for k in type(self).model_fields}
        data.update(changes)
        return type(self)(**data)


def with_password(dsn: str, password: str) -> str:
    """`dsn` with `password` set for its user (quoted for a URL)."""
    parts = urlsplit(dsn)
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    netloc = f"{user}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


def nkey_seed(value: SecretStr) -> bytes:
    """The NKey seed of SCHEDULER_NATS_NKEY_SEED: the seed itself (`SU...`) or the path of a file
    holding it (as `nsc` writes them). ValueError names the problem, never the seed."""
    text = value.get_secret_value().strip()
    if not _SEED.fullmatch(text):
        path = Path(text)
        if not path.is_file():
            raise ValueError("is neither a user seed (SU...) nor a readable file")
        try:
            found = _SEED.search(path.read_text(errors="replace"))
        except OSError as exc:
            raise ValueError(f"{text!r} cannot be read ({exc.strerror})") from None
        if found is None:
            raise ValueError(f"{text!r} holds no user seed (a line starting SU)")
        text = found.group(0)
    return text.encode()


_SEED = re.compile(r"SU[A-Z2-7]{56}")
_CREDS_JWT = re.compile(r"-+BEGIN NATS USER JWT-+\s*\n\s*[\w-]+\.[\w-]+\.[\w-]+")


def _check_postgres_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres", "postgresql+asyncpg"):
        raise ValueError(
            f"must start with postgresql:// (got scheme {parts.scheme or 'none'!r}); "
            "a unix socket is written postgresql://user@/db?host=/path/to/dir"
        )
    host = parse_qs(parts.query).get("host")
    if not parts.hostname and not host:
        raise ValueError("names no host: give user@host/db or ?host=/socket/dir")


def redact_url(url: str, token: bool = False) -> str:
    """The URL with any password replaced by ***; with `token`, a user name without a password
    too (NATS reads `nats://secret@host` as a token)."""
    parts = urlsplit(url)
    if parts.password is not None:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    elif token and parts.username is not None:
        netloc = "***@" + parts.netloc.rsplit("@", 1)[1]
    else:
        return url
    return urlunsplit(parts._replace(netloc=netloc))


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Load and validate settings; every problem becomes one ConfigError naming the variable."""
    if config_file is not None:
        if not Path(config_file).is_file():
            raise ConfigError(CONFIG_ENV, f"config file {str(config_file)!r} does not exist")
        os.environ[CONFIG_ENV] = str(config_file)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise _config_error(exc) from None


def _config_error(exc: ValidationError) -> ConfigError:
    problems = [_describe(err) for err in exc.errors()]
    variable, first = problems[0]
    others = "".join(f"; {v}: {m}" for v, m in problems[1:])
    return ConfigError(variable, first + others)


_SECRET_FIELDS = {"database_url", "nats_password", "nats_token", "nats_nkey_seed"}


def _describe(err: Any) -> tuple[str, str]:
    message = str(err["msg"]).removeprefix("Value error, ")
    name = str(err["loc"][0]) if err["loc"] else ""
    if not name:
        # a check across fields: its message starts with the variable to fix; the input is the
        # whole configuration (secrets included), so it is not shown
        variable, sep, rest = message.partition(": ")
        if sep and _VARIABLE.fullmatch(variable):
            return variable, rest
        return "settings", message
    variable = ENV_PREFIX + name.upper()
    shown = "<redacted>" if name in _SECRET_FIELDS else err.get("input")
    return variable, f"{message} (got {shown!r})"


_VARIABLE = re.compile(r"SCHEDULER_[A-Z_]+")
