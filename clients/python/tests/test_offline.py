"""The SSE parser and the delta view, without a server."""

from __future__ import annotations

import json

from conftest import FIXTURES

from streamgate_client import DeltaBuilder, Event, SSEMessage, SSEParser


def parse(*chunks: str) -> list[SSEMessage]:
    parser = SSEParser()
    return [msg for chunk in chunks for msg in parser.feed(chunk)]


def test_sse_line_endings_comments_and_fields() -> None:
    stream = (
        ':\r\n\r\nid: 1\r\ndata: {"a":\r\ndata:1}\r\n\r\n'  # a heartbeat, then two data lines
        ": heartbeat\n\nevent: error\ndata: x\r\r"
        "data:  two spaces\n\n"
    )
    expected = [
        SSEMessage("message", '{"a":\n1}', "1"),
        SSEMessage("error", "x", "1"),  # the id carries over
        SSEMessage("message", " two spaces", "1"),
    ]
    assert parse(stream) == expected
    assert parse(*stream) == expected  # one character at a time: `\r\n` split across chunks


def test_sse_skips_messages_without_data() -> None:
    assert parse("event: error\nid: 7\n\ndata\n\n") == [SSEMessage("message", "", "7")]


def events(path: str) -> list[Event]:
    lines = (FIXTURES / path).read_text().splitlines()
    return [Event.from_json(line) for line in lines]


def fold(path: str) -> list:
    view = DeltaBuilder()
    return [d for d in (view.apply(e, 0) for e in events(path)) if d is not None]


def test_deltas_accumulate_thinking_variants_and_commentary() -> None:
    deltas = fold("codex-appserver/summary.expected.jsonl")
    assert [d.seq for d in deltas] == [2, 3, 6, 7, 8]  # the snapshots repeat what the deltas said
    assert deltas[-1].thinking == "Plan it\n\nraw step"
    assert deltas[-1].content == "Yes" and deltas[-1].final == "Yes"
    assert deltas[2].final is None and deltas[-1].done and not deltas[-2].done


def test_a_lifecycle_error_sets_error() -> None:
    deltas = fold("f1/error.expected.jsonl")
    assert (deltas[-1].content, deltas[-1].error, deltas[-1].done) == ("Working on", "Overloaded", True)
    cut = fold("f1/cut.expected.jsonl")[-1]
    assert (cut.thinking, cut.content, cut.error) == ("Plan first.", "Half an ans", "stream_closed")


def test_redacted_thinking_changes_nothing_shown() -> None:
    assert [d.seq for d in fold("f1/redacted.expected.jsonl")] == [6, 7, 8]


def test_snapshots_replace_a_segment() -> None:
    deltas = fold("f1e/snapshot-only.expected.jsonl")
    assert [(d.thinking, d.content, d.final) for d in deltas] == [
        ("Hmm.", "", None),
        ("Hmm.", "Hi", None),
        ("Hmm.", "Hi", "Hi"),
        ("Hmm.", "Hi", "Hi"),
    ]


def test_raw_is_the_whole_event() -> None:
    raw = {
        "seq": 4,
        "stream": "lifecycle",
        "data": {"phase": "end"},
        "tenant": "t",
        "run_id": "r",
        "ts_ms": 1,
    }
    event = Event.from_json(json.dumps(raw))
    assert (event.seq, event.stream, event.raw, event.terminal) == (4, "lifecycle", raw, True)
