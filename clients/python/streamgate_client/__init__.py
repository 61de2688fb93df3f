"""An async Python client of streamgate's run stream.

streamgate turns LLM providers' streaming formats into one canonical event grammar;
every channel (the web channel of `streamgate up` included) serves each run's events
over HTTP. This package reads them:

- `Client.list_runs()`: the channel's runs (`GET /v1/runs`, every page);
- `Client.events()`: one run's canonical events live (`GET /v1/runs/{tenant}/{run}/events`,
  Server-Sent Events), resumed with `Last-Event-ID` after a dropped connection;
- `Client.deltas()`: the same run as a growing view (thinking, commentary, final answer,
  tool activity, error) for a UI.

    async with Client.from_data_dir(".streamgate") as client:
        async for delta in client.deltas("default", "r1"):
            print(delta.content, delta.final)
"""

from ._client import (
    APIError,
    AuthError,
    Client,
    ConnectionLost,
    Event,
    IdleTimeout,
    Run,
    RunList,
    RunPages,
    StreamError,
    StreamgateError,
)
from ._deltas import DeltaBuilder, StreamDelta
from ._sse import SSEMessage, SSEParser

__all__ = [
    "APIError",
    "AuthError",
    "Client",
    "ConnectionLost",
    "DeltaBuilder",
    "Event",
    "IdleTimeout",
    "Run",
    "RunList",
    "RunPages",
    "SSEMessage",
    "SSEParser",
    "StreamDelta",
    "StreamError",
    "StreamgateError",
]
