"""A small incremental parser of Server-Sent Events (the `text/event-stream` format).

Feed it decoded text as it arrives; it returns the messages each blank line completes.
It follows the WHATWG rules: lines end in `\\r\\n`, `\\n` or `\\r`; `:` starts a comment
(heartbeats); `data:` lines of one message join with `\\n`; one space after the colon
is dropped; `id:` is remembered across messages; a message without data is skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_EOL = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class SSEMessage:
    """One dispatched message."""

    event: str
    data: str
    id: str | None


class SSEParser:
    """Turns chunks of a text/event-stream into `SSEMessage`s."""

    def __init__(self) -> None:
        self._buf = ""
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, text: str) -> list[SSEMessage]:
        """Adds `text`; returns the messages it completes."""
        self._buf += text
        out: list[SSEMessage] = []
        pos = 0
        for m in _EOL.finditer(self._buf):
            if m.group() == "\r" and m.end() == len(self._buf):
                break  # maybe the first half of a `\r\n` split across chunks
            msg = self._line(self._buf[pos : m.start()])
            pos = m.end()
            if msg is not None:
                out.append(msg)
        self._buf = self._buf[pos:]
        return out

    def _line(self, line: str) -> SSEMessage | None:
        if not line:  # a blank line dispatches the message
            msg = None
            if self._data:
                msg = SSEMessage(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data = "", []
            return msg
        if line.startswith(":"):
            return None  # a comment: the server's heartbeat
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None
