"""The producer examples of `examples/` (Go, TypeScript), built for the tests that run them.

Each build lands in `.venv/tools/examples/<language>-<hash of its sources>/` (or under
`$SCHEDULER_TOOLS_DIR`): a second run, or a run in another checkout of the same sources, finds
it there and starts at once; editing a source makes a new one. Where a toolchain is missing,
`ExampleUnavailable` says in one line what to install (the tests skip with it).

- Go: Debian's `golang-go` and `golang-github-nats-io-go-nats-dev`, built offline in GOPATH
  mode (`GO111MODULE=off GOPATH=/usr/share/gocode go build`), the build cache beside the builds;
- TypeScript: node 20 or later and npm; `npm ci` from the committed package-lock (npm's cache
  beside the builds), then the lock's `tsc`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.docs_blocks import ROOT
from tests.support.tools import tools_dir

GO_SOURCES = ROOT / "examples" / "go"
TS_SOURCES = ROOT / "examples" / "ts"
GOPATH = Path("/usr/share/gocode")
NATS_GO = GOPATH / "src" / "github.com" / "nats-io" / "nats.go"
NODE_MAJOR = 20
BUILD_TIMEOUT = 600


class ExampleUnavailable(Exception):
    """A toolchain an example needs is missing; the message says which, in one line."""


def go_producer() -> list[str]:
    """The command that runs the Go producer (built now if these sources never were)."""
    if shutil.which("go") is None:
        raise ExampleUnavailable("no go toolchain (apt-get install golang-go)")
    if not NATS_GO.is_dir():
        raise ExampleUnavailable(
            f"no nats.go in {NATS_GO.parent} (apt-get install golang-github-nats-io-go-nats-dev)"
        )
    sources = sorted(GO_SOURCES.glob("*.go"))
    folder = _built("go", sources, _build_go)
    return [str(folder / "producer")]


def ts_producer() -> list[str]:
    """The command that runs the TypeScript producer (installed and compiled now if these
    sources never were)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise ExampleUnavailable(f"no node {NODE_MAJOR}+ with npm (apt-get install nodejs npm)")
    version = _run([node, "--version"], ROOT).strip()
    if int(re.sub(r"^v(\d+).*", r"\1", version)) < NODE_MAJOR:
        raise ExampleUnavailable(f"node {NODE_MAJOR}+ needed, found {version}")
    sources = [
        TS_SOURCES / "package.json",
        TS_SOURCES / "package-lock.json",
        TS_SOURCES / "tsconfig.json",
        *sorted((TS_SOURCES / "src").glob("*.ts")),
    ]
    folder = _built("ts", sources, _build_ts)
    return [node, str(folder / "dist" / "producer.js")]


def _build_go(into: Path) -> None:
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": str(GOPATH),
        "GOCACHE": str(_cache() / "go-build"),
        "GOFLAGS": "",
    }
    _run(["go", "build", "-o", str(into / "producer"), "."], GO_SOURCES, env)


def _build_ts(into: Path) -> None:
    for name in ("package.json", "package-lock.json", "tsconfig.json"):
        shutil.copy2(TS_SOURCES / name, into / name)
    shutil.copytree(TS_SOURCES / "src", into / "src")
    npm_cache = str(_cache() / "npm")
    _run(["npm", "ci", "--cache", npm_cache, "--no-audit", "--no-fund", "--loglevel=error"], into)
    _run([str(into / "node_modules" / ".bin" / "tsc"), "-p", "."], into)


def _built(kind: str, sources: list[Path], build: Callable[[Path], None]) -> Path:
    """The folder holding the build of `sources`; `build` fills a new one if there is none."""
    digest = hashlib.sha256()
    for path in sources:
        digest.update(f"{path.relative_to(ROOT)}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    final = _cache() / f"{kind}-{digest.hexdigest()[:16]}"
    with _locked():
        if not final.is_dir():
            scratch = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=_cache()))
            try:
                build(scratch)
                scratch.rename(final)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return final


def _cache() -> Path:
    folder = tools_dir() / "examples"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def _locked() -> Iterator[None]:
    """One build at a time (two test runs may start together)."""
    with open(_cache() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout
