"""The HTTP client: `GET /v1/runs` (paged) and `GET /v1/runs/{tenant}/{run}/events` (SSE)."""

from __future__ import annotations

import asyncio
import codecs
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Generator
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import parse_qs, quote, urlsplit

import httpx

from ._deltas import DeltaBuilder, StreamDelta
from ._sse import SSEParser

RunStatus = Literal["open", "ended", "all"]


class StreamgateError(Exception):
    """Base class of this client's errors."""


class AuthError(StreamgateError):
    """The server refused the channel token (401) or its use (403)."""


class APIError(StreamgateError):
    """Any other refusal: `status` is the HTTP status, the message is the server's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class StreamError(StreamgateError):
    """The server ended a run stream with `event: error` (e.g. the run did not start)."""


class IdleTimeout(StreamgateError):
    """No bytes (not even a heartbeat) arrived for `idle_timeout` seconds."""


class ConnectionLost(StreamgateError):
    """The stream kept dropping: every reconnect attempt failed."""


@dataclass(frozen=True)
class Run:
    """One row of `GET /v1/runs`."""

    tenant: str
    run_id: str
    status: Literal["open", "ended"]
    chat_id: str
    session_key: str | None = None
    last_seq: int | None = None
    ended_at_ms: int | None = None


@dataclass(frozen=True)
class Event:
    """One canonical event: `raw` is the whole JSON (envelope: tenant, run_id, ts_ms, ...)."""

    seq: int
    stream: str
    data: dict[str, Any]
    raw: dict[str, Any]

    @property
    def terminal(self) -> bool:
        """True for the run's last event (lifecycle `end` or `error`)."""
        return self.stream == "lifecycle" and self.data.get("phase") in ("end", "error")

    @classmethod
    def from_json(cls, text: str) -> Event:
        raw = json.loads(text)
        return cls(seq=int(raw["seq"]), stream=raw["stream"], data=raw.get("data") or {}, raw=raw)


class RunList(list[Run]):
    """Every run of `list_runs` (all pages); also readable with `async for`."""

    async def __aiter__(self) -> AsyncIterator[Run]:
        for run in self:
            yield run


class RunPages:
    """`async for run in client.list_runs()` pages lazily; `await client.list_runs()`
    gives all of them at once as a `RunList`."""

    def __init__(self, pages: AsyncIterator[Run]) -> None:
        self._pages = pages

    def __aiter__(self) -> AsyncIterator[Run]:
        return self._pages

    def __await__(self) -> Generator[Any, None, RunList]:
        return self._all().__await__()

    async def _all(self) -> RunList:
        return RunList([run async for run in self._pages])


class Client:
    """An async client of one channel's run stream (e.g. `streamgate up`'s web channel).

    `base_url` is the channel's address (`http://127.0.0.1:PORT`, the page address
    without `/?token=`), `token` its channel token. Use it as `async with Client(...)`.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        retries: int = 5,
        backoff: float = 0.25,
    ) -> None:
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token.strip()}"},
            timeout=timeout,
        )

    @classmethod
    def from_page_url(cls, url: str, **kwargs: Any) -> Client:
        """A client from the page address `streamgate up` prints (`http://…/?token=…`)."""
        parts = urlsplit(url)
        token = parse_qs(parts.query).get("token", [""])[0]
        return cls(f"{parts.scheme}://{parts.netloc}", token, **kwargs)

    @classmethod
    def from_data_dir(
        cls, data_dir: str | Path = ".streamgate", channel: str = "web", **kwargs: Any
    ) -> Client:
        """A client of a local `streamgate up`, from its data dir (`up.json` and the
        channel's token file)."""
        data = Path(data_dir)
        up = json.loads((data / "up.json").read_text())
        addr = next(c["web"] for c in up["channels"] if c["name"] == channel and c.get("web"))
        token = (data / f"channel-{channel}.token").read_text()
        return cls(f"http://{addr}", token, **kwargs)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes every connection."""
        await self._http.aclose()

    # --- GET /v1/runs -------------------------------------------------------------

    def list_runs(
        self, tenant: str | None = None, status: RunStatus = "all", *, limit: int | None = None
    ) -> RunPages:
        """The channel's runs, ordered by tenant and run id, following `next` over all pages
        (`limit`: rows per page)."""
        return RunPages(self._runs(tenant, status, limit))

    async def _runs(self, tenant: str | None, status: RunStatus, limit: int | None) -> AsyncIterator[Run]:
        names = {f.name for f in fields(Run)}
        cursor: str | None = None
        while True:
            params = {"tenant": tenant, "status": status, "after": cursor, "limit": limit}
            resp = await self._http.get("/v1/runs", params={k: v for k, v in params.items() if v is not None})
            await _check(resp)
            page = resp.json()
            for row in page["runs"]:
                yield Run(**{k: v for k, v in row.items() if k in names})
            if cursor and page.get("next") == cursor:
                # A tenant holding `/` makes the server's cursor ambiguous: it repeats.
                raise StreamgateError(f"GET /v1/runs repeated its cursor {cursor!r}: paging stopped")
            cursor = page.get("next")
            if not cursor:
                return

    # --- GET /v1/runs/{tenant}/{run}/events ----------------------------------------

    async def events(
        self,
        tenant: str,
        run_id: str,
        *,
        after: int = 0,
        idle_timeout: float | None = 60.0,
        wait: int | None = None,
    ) -> AsyncGenerator[Event, None]:
        """The run's events after seq `after`, live, until its terminal event.

        A dropped connection is resumed with `Last-Event-ID` (no gap, no duplicate), up to
        `retries` failed attempts in a row with exponential backoff, then `ConnectionLost`.
        `IdleTimeout` when nothing arrives for `idle_timeout` s (heartbeats come every 15 s);
        `StreamError` for the server's `event: error`; `wait`: how long the server waits for
        a run that has not started (its default: 300 s). Leaving the loop (or cancelling
        the task) closes the connection; `contextlib.aclosing` makes that immediate.
        """
        path = f"/v1/runs/{quote(tenant, safe='')}/{quote(run_id, safe='')}/events"
        params = {} if wait is None else {"wait": wait}
        timeout = httpx.Timeout(self._timeout, read=idle_timeout)
        last, failures = after, 0
        while True:
            headers = {"Last-Event-ID": str(last)} if last > 0 else {}
            try:
                async with self._http.stream(
                    "GET", path, params=params, headers=headers, timeout=timeout
                ) as resp:
                    await _check(resp)
                    parser, text = SSEParser(), codecs.getincrementaldecoder("utf-8")()
                    async for chunk in resp.aiter_bytes():
                        for msg in parser.feed(text.decode(chunk)):
                            if msg.event == "error":
                                raise StreamError(_error_message(msg.data))
                            event = Event.from_json(msg.data)
                            if event.seq <= last:
                                continue  # never a duplicate, even from a misbehaving proxy
                            last, failures = event.seq, 0
                            yield event
                            if event.terminal:
                                return
                return  # the server closed the stream on purpose (nothing after `last`)
            except httpx.ReadTimeout as e:
                raise IdleTimeout(f"no data from the run stream for {idle_timeout} s") from e
            except httpx.TransportError as e:
                failures += 1
                if failures > self._retries:
                    raise ConnectionLost(f"run stream lost after {self._retries} reconnects: {e!r}") from e
                await asyncio.sleep(self._backoff * 2 ** (failures - 1))

    async def deltas(
        self,
        tenant: str,
        run_id: str,
        *,
        after: int = 0,
        idle_timeout: float | None = 60.0,
        wait: int | None = None,
    ) -> AsyncGenerator[StreamDelta, None]:
        """The run as a growing view: one `StreamDelta` per event that changes it.

        An idle timeout or the server's `event: error` does not raise: it ends the
        iteration with a last delta whose `error` says why (`done` is then true).
        """
        start, view = time.monotonic(), DeltaBuilder()
        events = self.events(tenant, run_id, after=after, idle_timeout=idle_timeout, wait=wait)

        def elapsed() -> int:
            return int((time.monotonic() - start) * 1000)

        try:
            async for event in events:
                delta = view.apply(event, elapsed())
                if delta is not None:
                    yield delta
        except (IdleTimeout, StreamError) as e:
            yield view.fail(str(e), elapsed())
        finally:
            await events.aclose()


async def _check(resp: httpx.Response) -> None:
    """Raises the error of a refused request."""
    if resp.status_code < 400:
        return
    await resp.aread()
    message = resp.text.strip()
    try:
        message = str(resp.json()["error"])
    except (ValueError, KeyError, TypeError):
        pass
    if resp.status_code == 401:
        raise AuthError(
            f"streamgate refused the channel token (401: {message}). Pass the channel's token: "
            "the `token=` of the page address `streamgate up` printed, or the contents of "
            "`<data dir>/channel-web.token`"
        )
    if resp.status_code == 403:
        raise AuthError(f"the channel token is not allowed here (403: {message})")
    raise APIError(resp.status_code, message)


def _error_message(data: str) -> str:
    try:
        return str(json.loads(data)["error"])
    except (ValueError, KeyError, TypeError):
        return data
