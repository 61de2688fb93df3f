#!/usr/bin/env python3
"""Probes of an instance's bounds on a local `streamgate up` (standard library only).

Each probe starts its own `up` in a temporary data dir (STREAMGATE_NATS_SERVER may name a
current nats-server), drives it over HTTP ingest, prints what it measured and stops it.

    # One never-ending Chat Completions answer of 1 KB deltas: up's RSS every 5 s.
    python3 scripts/probe_bounds.py never-ending --bin target/release/streamgate --secs 60

    # A 20 MB still-open thinking segment (300-byte deltas), with a 1 KB run in another
    # chat every 0.5 s: small runs' ingest -> webhook final, the big run's final after its
    # last frame, and up's CPU seconds. `--channels` runs web + webhook with
    # `--reasoning stream`; without it, no channel (the CPU baseline).
    python3 scripts/probe_bounds.py long-thinking --bin target/release/streamgate --mb 20 --channels
    python3 scripts/probe_bounds.py long-thinking --bin target/release/streamgate --mb 20

    # N connections that send nothing, re-opened as the server closes them, while a
    # legitimate ingest is timed every 0.5 s.
    python3 scripts/probe_bounds.py idle-flood --bin target/release/streamgate --conns 1100
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOOK_SECRET = "probe-hook-secret"


class Up:
    """A `streamgate up` in a temporary data dir."""

    def __init__(self, binary, extra):
        self.dir = tempfile.mkdtemp(prefix="sg-probe-")
        data = os.path.join(self.dir, "data")
        self.log = open(os.path.join(self.dir, "up.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "up", "--data-dir", data, "--quiet", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        addresses = os.path.join(data, "addresses.json")
        for _ in range(200):
            try:
                bound = json.load(open(addresses))["bound"]
                if "ingest_http" in bound:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        else:
            raise SystemExit(f"up did not start; see {self.log.name}")
        self.port = int(bound["ingest_http"].rsplit(":", 1)[1])
        self.token = open(os.path.join(data, "ingest.token")).read().strip()
        time.sleep(1)

    def rss_mib(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
        return -1

    def cpu_secs(self):
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def lease_losses(self):
        self.log.flush()
        text = open(self.log.name, errors="replace").read().lower()
        return text.count("not renewed") + text.count("lease lost")

    def post(self, path, chunks):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c.putrequest("POST", path)
        c.putheader("Authorization", "Bearer " + self.token)
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        for b in chunks:
            c.send(b"%x\r\n%s\r\n" % (len(b), b))
        c.send(b"0\r\n\r\n")
        r = c.getresponse()
        r.read()
        return r.status

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def sse(event, data):
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def anthropic_head(run):
    return sse("message_start", {"type": "message_start", "message": {
        "id": run, "type": "message", "role": "assistant", "model": "probe", "content": [],
        "stop_reason": None, "usage": {"input_tokens": 5, "output_tokens": 1}}})


def anthropic_answer(text, index):
    return (sse("content_block_start", {"type": "content_block_start", "index": index,
                                        "content_block": {"type": "text", "text": ""}})
            + sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "text_delta", "text": text}})
            + sse("content_block_stop", {"type": "content_block_stop", "index": index})
            + sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                    "usage": {"output_tokens": 9}})
            + sse("message_stop", {"type": "message_stop"}))


def never_ending(args):
    up = Up(args.bin, [])
    word = ("lorem ipsum dolor sit amet " * 38).encode()  # ~1 KB
    chunk = lambda content: b"data: " + json.dumps({
        "id": "c1", "object": "chat.completion.chunk", "model": "probe",
        "choices": [{"index": 0, "delta": {"content": content}}]}).encode() + b"\n\n"
    sent = [0]
    done = [False]

    def body():
        yield chunk("")
        frame = chunk(word.decode()) * 16
        t0 = time.time()
        while time.time() - t0 < args.secs:
            sent[0] += len(frame)
            yield frame
        done[0] = True

    t = threading.Thread(target=lambda: up.post("/v1/ingest/default/never?family=f2", body()))
    t.start()
    t0, peak = time.time(), 0
    while not done[0]:
        rss = up.rss_mib()
        peak = max(peak, rss)
        print(f"t={time.time() - t0:5.1f} s  up RSS {rss} MiB  sent {sent[0] >> 20} MiB", flush=True)
        time.sleep(5)
    t.join()
    print(f"sent {sent[0] >> 20} MiB in {args.secs:.0f} s; up's peak RSS {peak} MiB")
    up.stop()


def long_thinking(args):
    finals = {}

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                op = json.loads(body)
                if op.get("op") == "final":
                    finals.setdefault(op["run_id"], time.time())
            except ValueError:
                pass
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    extra = []
    if args.channels:
        hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        threading.Thread(target=hook.serve_forever, daemon=True).start()
        extra = ["--reasoning", "stream", "--channel",
                 f"webhook=http://127.0.0.1:{hook.server_address[1]}/hook",
                 "--channel-secret", HOOK_SECRET]
    else:
        extra = ["--no-web"]
    up = Up(args.bin, extra)
    small, stop = {}, [False]

    def smalls():
        i = 0
        while not stop[0]:
            run = f"small{i}"
            t0 = time.time()
            up.post(f"/v1/ingest/default/{run}?family=f1&session=chat{i}",
                    [anthropic_head(run) + anthropic_answer("x" * 1000, 0)])
            small[run] = t0
            i += 1
            time.sleep(0.5)

    def big():
        yield anthropic_head("big")
        yield sse("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "thinking", "thinking": ""}})
        delta = ("Let me think about this step by step, considering each part. " * 5)[:300]
        frame = sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "thinking_delta", "thinking": delta}})
        for _ in range(int(args.mb * 1e6 / 300) // 64):
            yield frame * 64
        yield sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        yield anthropic_answer("The answer is 42.", 1)

    cpu0, t_start = up.cpu_secs(), time.time()
    if args.channels:
        threading.Thread(target=smalls, daemon=True).start()
    status = up.post("/v1/ingest/default/big?family=f1&session=bigchat", big())
    t_last = time.time()
    print(f"big run: HTTP {status}, ingested in {t_last - t_start:.1f} s")
    if args.channels:
        deadline = time.time() + 120
        while "big" not in finals and time.time() < deadline:
            time.sleep(0.05)
        print(f"big run's final {finals.get('big', float('nan')) - t_last:.2f} s after its last frame")
    prev = up.cpu_secs()
    while True:  # until the pipeline is idle
        time.sleep(2)
        now = up.cpu_secs()
        if now - prev < 0.05:
            break
        prev = now
    stop[0] = True
    print(f"up CPU {up.cpu_secs() - cpu0:.2f} s; lease losses in up's log: {up.lease_losses()}")
    if args.channels:
        lat = sorted(finals[r] - t0 for r, t0 in small.items() if r in finals)
        missing = len(small) - len(lat)
        if lat:
            print(f"small runs: {len(lat)} finals, ingest -> final max {lat[-1]:.3f} s, "
                  f"p50 {lat[len(lat) // 2]:.3f} s, missing {missing}")
    up.stop()


def idle_flood(args):
    up = Up(args.bin, [])
    stop = [False]

    def flood():
        socks = []
        while not stop[0]:
            while len(socks) < args.conns and not stop[0]:
                try:
                    s = socket.create_connection(("127.0.0.1", up.port), timeout=2)
                    s.setblocking(False)
                    socks.append(s)
                except OSError:
                    time.sleep(0.01)
            alive = []
            for s in socks:
                try:
                    if s.recv(1) == b"":
                        s.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    continue
                alive.append(s)
            socks = alive
            time.sleep(0.05)

    threading.Thread(target=flood, daemon=True).start()
    time.sleep(3)
    body = anthropic_head("f") + sse("message_stop", {"type": "message_stop"})
    lat, failed, i, t0 = [], 0, 0, time.time()
    while time.time() - t0 < args.secs:
        t = time.time()
        try:
            if up.post(f"/v1/ingest/default/flood{i}?family=f1", [body]) != 200:
                failed += 1
        except OSError:
            failed += 1
        lat.append(time.time() - t)
        i += 1
        time.sleep(0.5)
    stop[0] = True
    lat.sort()
    print(f"{len(lat)} ingests beside {args.conns} idle connections: max {lat[-1] * 1000:.0f} ms, "
          f"p50 {lat[len(lat) // 2] * 1000:.0f} ms, failed {failed}")
    up.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="probe", required=True)
    for name in ["never-ending", "long-thinking", "idle-flood"]:
        s = sub.add_parser(name)
        s.add_argument("--bin", default="target/release/streamgate")
        s.add_argument("--secs", type=float, default=60 if name == "never-ending" else 30)
        if name == "long-thinking":
            s.add_argument("--mb", type=float, default=20)
            s.add_argument("--channels", action="store_true")
        if name == "idle-flood":
            s.add_argument("--conns", type=int, default=1100)
    args = p.parse_args()
    {"never-ending": never_ending, "long-thinking": long_thinking,
     "idle-flood": idle_flood}[args.probe](args)


if __name__ == "__main__":
    main()
