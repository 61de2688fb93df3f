#!/usr/bin/env python3
"""Run-stream latency on a local `streamgate up` (standard library only).

For N concurrent runs, each run is POSTed to HTTP ingest as an Anthropic SSE turn, one
text delta at a time with a pause between deltas, while a client follows the run on the
web channel's run stream (/v1/runs/{tenant}/{run}/events). For every delta it records
the time from writing the delta's frame into the ingest connection to reading its event
from the run stream (frame bytes at ingest -> event at the client), and prints p50, p99
and max over all deltas.

    python3 scripts/bench_run_stream.py --bin target/release/streamgate --runs 1
    python3 scripts/bench_run_stream.py --bin target/release/streamgate --runs 200

It starts its own `up` in a temporary data dir (STREAMGATE_NATS_SERVER may name a
current nats-server) and stops it at the end.
"""
import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import tempfile
import time


def frame(obj):
    return f"data: {json.dumps(obj)}\n\n".encode()


async def post_run(addr, token, run, deltas, pause, sent):
    host, port = addr.split(":")
    r, w = await asyncio.open_connection(host, int(port))
    w.write(
        f"POST /v1/ingest/default/{run}?family=f1 HTTP/1.1\r\nHost: {addr}\r\n"
        f"Authorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    )

    async def chunk(data):
        w.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await w.drain()

    await chunk(frame({"type": "message_start", "message": {"id": run, "type": "message", "role": "assistant",
                                                           "model": "m", "content": [], "usage": {"input_tokens": 1, "output_tokens": 1}}}))
    await chunk(frame({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}))
    for i in range(deltas):
        await asyncio.sleep(pause)
        text = f"<{run}:{i}>"
        sent[(run, text)] = time.perf_counter()
        await chunk(frame({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}))
    await chunk(frame({"type": "content_block_stop", "index": 0}))
    await chunk(frame({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 6}}))
    await chunk(frame({"type": "message_stop"}))
    w.write(b"0\r\n\r\n")
    await w.drain()
    await r.read(4096)
    w.close()


async def follow_run(web, token, run, sent, lat, ready):
    host, port = web.split(":")
    r, w = await asyncio.open_connection(host, int(port))
    w.write(
        f"GET /v1/runs/default/{run}/events HTTP/1.1\r\nHost: {web}\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await w.drain()
    ready.set()
    buf = b""
    while True:
        data = await r.read(65536)
        if not data:
            break
        now = time.perf_counter()
        buf += data
        for m in re.finditer(rb'"delta":"(<[^"]*>)"', buf):
            key = (run, m.group(1).decode())
            if key in sent and key not in lat:
                lat[key] = now - sent[key]
        if b'"phase":"end"' in buf or b'"phase":"error"' in buf:
            break
        buf = buf[-512:]
    w.close()


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


async def main(args):
    data = tempfile.mkdtemp(prefix="sg-bench-")
    err = open(os.path.join(data, "up.err"), "w")
    up = subprocess.Popen([args.bin, "up", "--quiet", "--data-dir", os.path.join(data, "d")],
                          stdout=subprocess.DEVNULL, stderr=err)
    try:
        info_path = os.path.join(data, "d", "up.json")
        for _ in range(600):
            if os.path.exists(info_path):
                break
            await asyncio.sleep(0.05)
        info = json.load(open(info_path))
        ingest = info["ingest_http"].split("://")[-1]
        token = open(os.path.join(data, "d", "ingest.token")).read().strip()
        web = info["channels"][0]["web"]
        web_token = open(os.path.join(data, "d", "channel-web.token")).read().strip()
        sent, lat = {}, {}
        runs = [f"b{i}" for i in range(args.runs)]
        readies = [asyncio.Event() for _ in runs]
        followers = [asyncio.create_task(follow_run(web, web_token, r, sent, lat, e)) for r, e in zip(runs, readies)]
        for e in readies:
            await e.wait()
        t0 = time.perf_counter()
        await asyncio.gather(*(post_run(ingest, token, r, args.deltas, args.pause, sent) for r in runs))
        await asyncio.wait_for(asyncio.gather(*followers), timeout=120)
        wall = time.perf_counter() - t0
        ms = [v * 1000 for v in lat.values()]
        print(json.dumps({"runs": args.runs, "deltas_per_run": args.deltas, "events_measured": len(ms),
                          "missing": len(sent) - len(ms), "p50_ms": round(pct(ms, 0.5), 2),
                          "p99_ms": round(pct(ms, 0.99), 2), "max_ms": round(max(ms), 2) if ms else None,
                          "wall_s": round(wall, 2)}))
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=20)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/streamgate")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--deltas", type=int, default=50)
    ap.add_argument("--pause", type=float, default=0.05)
    asyncio.run(main(ap.parse_args()))
