"""The client against a real `streamgate up` (see conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from conftest import Up, capture, expected, ingest, new_id

from streamgate_client import AuthError, Client, Event, StreamError

TOOL_USE = expected("tool-use")  # 7 events: start, commentary, tool start/2 updates/end, end


def shape(events: list[Event]) -> list[dict]:
    return [{"seq": e.seq, "stream": e.stream, "data": e.data} for e in events]


async def wait_for(seq: int, seen: list[Event], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not seen or seen[-1].seq < seq:
        assert time.monotonic() < deadline, f"no event {seq} in {timeout} s (got {[e.seq for e in seen]})"
        await asyncio.sleep(0.02)


async def follow(client: Client, tenant: str, run: str, seen: list[Event], **kwargs) -> None:
    async for event in client.events(tenant, run, **kwargs):
        seen.append(event)


async def test_follows_a_live_run_to_its_end(up: Up) -> None:
    tenant, run, gate, seen = new_id("t"), new_id("run"), asyncio.Event(), []
    async with Client(up.base_url, up.token) as client:
        follower = asyncio.create_task(follow(client, tenant, run, seen, wait=60))
        sender = asyncio.create_task(ingest(up, tenant, run, capture("tool-use"), gate=gate, frames=5))
        await wait_for(3, seen)  # the tool started; the rest of the body is not sent yet
        assert not follower.done()
        gate.set()
        await asyncio.wait_for(follower, 20)  # ends on its own after the terminal event
        await sender
    assert shape(seen) == TOOL_USE
    assert seen[-1].terminal and seen[-1].raw["tenant"] == tenant and seen[-1].raw["run_id"] == run


async def test_list_runs_follows_every_page(up: Up) -> None:
    tenant = new_id("list")
    runs = sorted(new_id("run") for _ in range(3))
    for run in runs:
        await ingest(up, tenant, run, capture("end-turn"))
    async with Client(up.base_url, up.token) as client:
        deadline = time.monotonic() + 20
        while True:  # the channel lists a run once it has seen it end
            listed = [r async for r in client.list_runs(tenant=tenant, status="ended", limit=2)]
            if len(listed) == 3 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert [r.run_id for r in listed] == runs
        assert all(r.tenant == tenant and r.status == "ended" and r.ended_at_ms for r in listed)
        everything = await client.list_runs(status="all")
        assert {r.run_id for r in everything} >= set(runs)
        assert [r.run_id async for r in client.list_runs(tenant=tenant, status="open")] == []


async def test_after_resumes_past_a_seq(up: Up) -> None:
    tenant, run = new_id("t"), new_id("run")
    await ingest(up, tenant, run, capture("tool-use"))
    async with Client(up.base_url, up.token) as client:
        seen = [e async for e in client.events(tenant, run, after=3)]
    assert shape(seen) == TOOL_USE[3:]


async def test_a_dropped_connection_resumes_without_gap_or_duplicate(up: Up, make_proxy) -> None:
    tenant, run, gate, seen = new_id("t"), new_id("run"), asyncio.Event(), []
    sender = asyncio.create_task(ingest(up, tenant, run, capture("tool-use"), gate=gate, frames=5))
    proxy = await make_proxy(cut_after=b"id: 2\n")  # event 1, and the start of event 2
    async with Client(proxy.url, up.token, backoff=0.05) as client:
        follower = asyncio.create_task(follow(client, tenant, run, seen, wait=60))
        await wait_for(3, seen)
        gate.set()
        await asyncio.wait_for(follower, 20)
    await sender
    assert shape(seen) == TOOL_USE
    assert [c.closed_by for c in proxy.conns[:1]] == ["cut"] and len(proxy.conns) == 2
    assert b"last-event-id: 1\r\n" in bytes(proxy.conns[1].request).lower()


async def test_idle_timeout_ends_deltas_with_an_error(up: Up) -> None:
    async with Client(up.base_url, up.token) as client:
        start = time.monotonic()
        deltas = [d async for d in client.deltas("t", new_id("never"), idle_timeout=1, wait=30)]
        took = time.monotonic() - start
    assert len(deltas) == 1 and deltas[0].done
    assert deltas[0].error and "no data" in deltas[0].error
    assert deltas[0].final is None and deltas[0].elapsed_ms >= 1000
    assert took < 3


async def test_a_run_that_does_not_start_is_a_stream_error(up: Up) -> None:
    async with Client(up.base_url, up.token) as client:
        with pytest.raises(StreamError, match="did not start within 1 s"):
            async for _ in client.events("t", new_id("never"), wait=1):
                pass


async def test_deltas_of_a_live_run(up: Up) -> None:
    tenant, run = new_id("t"), new_id("run")
    sender = asyncio.create_task(ingest(up, tenant, run, capture("tool-use")))
    async with Client(up.base_url, up.token) as client:
        deltas = [d async for d in client.deltas(tenant, run, wait=60)]
    await sender
    assert [d.seq for d in deltas] == [2, 3, 6, 7]  # the tool's argument bytes change nothing shown
    assert deltas[0].content == "Let me check the weather."
    assert [d.tool for d in deltas[1:3]] == [
        {"id": "toolu_1", "name": "get_weather", "phase": "start", "status": "in_progress"},
        {"id": "toolu_1", "name": "get_weather", "phase": "end", "status": "completed"},
    ]
    assert deltas[-1].done and deltas[-1].error is None and deltas[-1].final is None
    assert [d.elapsed_ms for d in deltas] == sorted(d.elapsed_ms for d in deltas)


@pytest.mark.parametrize("how", ["break", "aclosing", "cancel"])
async def test_leaving_the_stream_closes_the_connection(up: Up, make_proxy, how: str) -> None:
    tenant, run, gate = new_id("t"), new_id("run"), asyncio.Event()
    sender = asyncio.create_task(ingest(up, tenant, run, capture("tool-use"), gate=gate, frames=5))
    proxy = await make_proxy()
    async with Client(proxy.url, up.token) as client:
        if how == "break":
            async for event in client.events(tenant, run, wait=60):
                if event.seq == 2:
                    break
        elif how == "aclosing":
            async with contextlib.aclosing(client.events(tenant, run, wait=60)) as events:
                async for event in events:
                    if event.seq == 2:
                        break
        else:
            seen: list[Event] = []
            follower = asyncio.create_task(follow(client, tenant, run, seen, wait=60))
            await wait_for(2, seen)
            follower.cancel()
            with pytest.raises(asyncio.CancelledError):
                await follower
        # The client closed the connection, while the run is still open (the body waits).
        await asyncio.wait_for(proxy.conns[0].closed.wait(), 5)
        assert proxy.conns[0].closed_by == "client"
    gate.set()
    await sender


async def test_a_wrong_token_is_an_auth_error_naming_the_token(up: Up) -> None:
    async with Client(up.base_url, "not-the-token") as client:
        with pytest.raises(AuthError, match="channel token") as refused:
            await client.list_runs()
        assert "401" in str(refused.value)
        with pytest.raises(AuthError, match="token"):
            async for _ in client.events("t", "r1"):
                pass


async def test_from_page_url_and_from_data_dir(up: Up) -> None:
    for client in (
        Client.from_page_url(f"{up.base_url}/?token={up.token}"),
        Client.from_data_dir(up.data_dir),
    ):
        async with client:
            await client.list_runs()
