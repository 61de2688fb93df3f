"""The run as a growing view: canonical events folded into `StreamDelta`s."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._client import Event

SEGMENT_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class StreamDelta:
    """The run so far, after the event `seq`.

    - `thinking`: all thinking text (raw and summary variants), segments joined by a
      blank line; `content`: all commentary text, likewise;
    - `final`: the final answer once it arrived, else None;
    - `error`: why the run (or the stream) failed: a lifecycle `error` event's
      diagnostic, an idle timeout, or the server's stream error; else None;
    - `tool`: `{"id", "name", "phase", "status"}` of a tool's start or end event, else None;
    - `done`: the last delta of the stream; `elapsed_ms`: since the iteration started.
    """

    seq: int | None
    thinking: str
    content: str
    final: str | None
    error: str | None
    tool: dict[str, Any] | None
    done: bool
    elapsed_ms: int


class DeltaBuilder:
    """Folds events into `StreamDelta`s: `apply` returns None for an event that changes
    nothing a delta shows (a redacted-thinking marker, a tool's argument bytes, usage)."""

    def __init__(self) -> None:
        self._thinking: dict[Hashable, str] = {}
        self._content: dict[Hashable, str] = {}
        self._final: str | None = None
        self._error: str | None = None
        self._done = False
        self._seq: int | None = None

    def apply(self, event: Event, elapsed_ms: int) -> StreamDelta | None:
        self._seq = event.seq
        data, tool, changed = event.data, None, False
        phase = data.get("phase")
        if event.stream == "thinking" and data.get("variant") in ("raw", "summary"):
            changed = _merge(self._thinking, (data.get("variant"), data.get("id")), data)
        elif event.stream == "assistant" and phase == "final_answer":
            text = data.get("text")
            final = text if isinstance(text, str) else (self._final or "") + (data.get("delta") or "")
            changed, self._final = final != self._final, final
        elif event.stream == "assistant":
            changed = _merge(self._content, data.get("id"), data)
        elif event.stream == "item" and phase in ("start", "end"):
            tool = {k: data.get(k) for k in ("id", "name", "phase", "status")}
            changed = True
        elif event.stream == "lifecycle" and phase in ("end", "error"):
            if phase == "error":
                self._error = _lifecycle_error(data)
            changed = self._done = True
        return self._view(elapsed_ms, tool) if changed else None

    def fail(self, error: str, elapsed_ms: int) -> StreamDelta:
        """The last delta of a stream that broke off with `error`."""
        self._error, self._done = error, True
        return self._view(elapsed_ms, None)

    def _view(self, elapsed_ms: int, tool: dict[str, Any] | None) -> StreamDelta:
        return StreamDelta(
            seq=self._seq,
            thinking=SEGMENT_SEPARATOR.join(t for t in self._thinking.values() if t),
            content=SEGMENT_SEPARATOR.join(t for t in self._content.values() if t),
            final=self._final,
            error=self._error,
            tool=tool,
            done=self._done,
            elapsed_ms=elapsed_ms,
        )


def _merge(segments: dict[Hashable, str], key: Hashable, data: dict[str, Any]) -> bool:
    """Applies a `delta` (appended) or a `text` snapshot (replaces) to one segment."""
    old = segments.get(key, "")
    text = data.get("text")
    new = text if isinstance(text, str) else old + (data.get("delta") or "")
    if new == old:
        return False
    segments[key] = new
    return True


def _lifecycle_error(data: dict[str, Any]) -> str:
    diagnostic = data.get("diagnostic") or {}
    return str(diagnostic.get("message") or diagnostic.get("code") or data.get("reason") or "error")
