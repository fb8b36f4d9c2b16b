#!/usr/bin/env python3
"""Soak test of `mlx-gen serve` on loopback (issue 20, item 5): mixed traffic for a while, checking
that the server's memory stays flat after warm-up, that no KV block leaks, and that every answer is
either a completion or a 4xx/503 JSON error.

It starts the server itself (127.0.0.1, a free port) and runs `--clients` threads, each sending, in
a seeded random mix: chat and text completions, streaming and not, n > 1, stop strings, streams
the client leaves after a few chunks, non-streaming requests the client leaves before the answer,
oversized bodies (413), malformed bodies (400), fields the server does not implement (400) and
requests that can never fit the KV budget (400). Every `--sample` seconds it reads the server's RSS
(/proc/PID/status) and /metrics. At the end, with no client running, the server must be idle
(nothing queued or running, `mlxgen_kv_blocks_in_use 0`), the RSS after warm-up must not have grown
by more than `--rss-growth-mb` (the median of the last quarter of samples against the median of
the first quarter after warm-up), and no answer may have broken the rule above.

  python3 scripts/bench/soak.py --model PATH [--mlx-gen BIN] [--minutes 30 | --short] [--clients 4]
      [--json FILE]

`--short` is the two-minute mode the tests run (crates/cli/tests/server_soak.rs). Standard library
only; bounded: every request has a timeout, the run a deadline, and the server is stopped at the end.
Exit status 0 when every check holds, 1 otherwise.
"""

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_load import Started, default_mlx_gen, free_port, write_json  # noqa: E402  (this folder's helpers)

MAX_BODY = 65536
WORDS = ["river", "lamp", "orbit", "violin", "harbor", "maple", "signal", "copper", "meadow", "lantern", "cipher", "glacier"]


class Server(Started):
    """`mlx-gen serve` with the soak's limits; stopped by stop()."""

    def __init__(self, args):
        port = free_port()
        cmd = [args.mlx_gen, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
               "--max-body-bytes", str(MAX_BODY), "--max-batch-size", "8", "--kv-budget-mb", str(args.kv_budget_mb),
               "--prefix-cache-mb", str(args.prefix_cache_mb)]
        super().__init__("mlx-gen", cmd, port, 120)

    def rss_mb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return None


def request(port, method, path, body, timeout, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read(), r.getheader("Content-Type") or ""
    finally:
        conn.close()


def metrics(port):
    status, body, _ = request(port, "GET", "/metrics", None, 10)
    out = {}
    if status == 200:
        for line in body.decode().splitlines():
            if line.startswith("mlxgen_") and "{" not in line:
                k, v = line.split()
                out[k] = float(v)
    return out


def is_json_error(status, body):
    if not (400 <= status < 500 or status == 503):
        return False
    try:
        e = json.loads(body)["error"]
        return isinstance(e.get("message"), str)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def check_completion(body, chat, n):
    v = json.loads(body)
    choices = v["choices"]
    assert len(choices) == n, f"{len(choices)} choices, want {n}"
    for c in choices:
        assert c["finish_reason"] in ("stop", "length", "tool_calls"), c
        text = c["message"]["content"] if chat else c["text"]
        assert text is None or isinstance(text, str)
    assert v["usage"]["completion_tokens"] >= 0


def check_stream(raw, n):
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    assert events and events[-1].strip() == b"data: [DONE]", f"no [DONE] at the end: {raw[-200:]!r}"
    finished = set()
    for e in events[:-1]:
        assert e.startswith(b"data: "), e[:100]
        chunk = json.loads(e[6:])
        assert "error" not in chunk, f"an error inside a 200 stream: {chunk}"
        for c in chunk.get("choices") or []:
            if c.get("finish_reason"):
                finished.add(c["index"])
    assert finished == set(range(n)), f"choices finished: {sorted(finished)}, want {n}"


class Soak:
    def __init__(self, args, server):
        self.args, self.server = args, server
        self.lock = threading.Lock()
        self.counts = {}
        self.violations = []
        self.stop_at = 0

    def note(self, kind, ok, why=None):
        with self.lock:
            key = f"{kind}:{'ok' if ok else 'bad'}"
            self.counts[key] = self.counts.get(key, 0) + 1
            if not ok and len(self.violations) < 20:
                self.violations.append(f"{kind}: {why}")

    def body(self, rng, chat, stream, n, stop):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60)))
        b = {"max_tokens": rng.randint(1, 48), "n": n, "stream": stream, "temperature": rng.choice([0.0, 0.0, 0.8]), "seed": rng.randint(0, 99)}
        if chat:
            b["messages"] = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": words}]
        else:
            b["prompt"] = words
        if stop:
            b["stop"] = [rng.choice(WORDS), "\n"]
        return b

    def completion(self, rng):
        chat, stream = rng.random() < 0.5, rng.random() < 0.5
        n = rng.choice([1, 1, 2, 3])
        b = self.body(rng, chat, stream, n, rng.random() < 0.4)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        kind = f"{'chat' if chat else 'text'}-{'stream' if stream else 'json'}"
        status, raw, ctype = request(self.server.port, "POST", path, json.dumps(b), 300)
        try:
            if status == 200 and stream:
                assert ctype.startswith("text/event-stream"), ctype
                check_stream(raw, n)
            elif status == 200:
                check_completion(raw, chat, n)
            elif not is_json_error(status, raw):
                raise AssertionError(f"HTTP {status}: {raw[:200]!r}")
            self.note(kind, True)
        except (AssertionError, ValueError, KeyError, TypeError) as e:
            self.note(kind, False, e)

    def leave_stream(self, rng):
        b = self.body(rng, rng.random() < 0.5, True, rng.choice([1, 2]), False)
        b["max_tokens"] = 2000
        path = "/v1/chat/completions" if "messages" in b else "/v1/completions"
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=60)
        try:
            conn.request("POST", path, body=json.dumps(b), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status == 200:
                for _ in range(rng.randint(1, 6)):
                    r.fp.readline()
                self.note("leave-stream", True)
            else:
                ok = is_json_error(r.status, r.read())
                self.note("leave-stream", ok, f"HTTP {r.status}")
        finally:
            conn.close()

    def leave_before_answer(self, rng):
        b = self.body(rng, False, False, 1, False)
        b["max_tokens"] = 2000
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=30) as s:
            data = json.dumps(b).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
            time.sleep(rng.uniform(0.05, 0.5))
        self.note("leave-json", True)

    def hostile(self, rng):
        port = self.server.port
        cases = [
            ("oversized", "/v1/completions", json.dumps({"prompt": "x" * (MAX_BODY + 10)}), 413),
            ("malformed", "/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}', 400),
            ("malformed", "/v1/completions", "\x00\xff garbage", 400),
            ("bad-type", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}), 400),
            ("no-content", "/v1/chat/completions", json.dumps({"messages": [{"role": "user"}]}), 400),
            ("unimplemented", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "user": "u"}), 400),
            ("never-fits", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 1 << 20, "n": 8}), 400),
            ("too-many-n", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2, "n": 9}), 400),
        ]
        kind, path, body, want = rng.choice(cases)
        try:
            status, raw, _ = request(port, "POST", path, body.encode("latin-1") if isinstance(body, str) else body, 60)
        except (ConnectionResetError, BrokenPipeError):
            # A body over the limit may be refused before the client has sent all of it.
            self.note(kind, kind == "oversized", "connection reset")
            return
        self.note(kind, status == want and is_json_error(status, raw), f"HTTP {status} (want {want}): {raw[:160]!r}")

    def client(self, seed):
        rng = random.Random(seed)
        while time.time() < self.stop_at:
            r = rng.random()
            try:
                if r < 0.55:
                    self.completion(rng)
                elif r < 0.68:
                    self.leave_stream(rng)
                elif r < 0.76:
                    self.leave_before_answer(rng)
                else:
                    self.hostile(rng)
            except (OSError, http.client.HTTPException) as e:
                self.note("transport", False, f"{type(e).__name__}: {e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-gen", default=default_mlx_gen())
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--short", action="store_true", help="two minutes (30 s of warm-up), as the tests run it")
    ap.add_argument("--warmup", type=float, default=None, help="seconds before the RSS baseline (default: a sixth of the run)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--sample", type=float, default=2.0, help="seconds between RSS and /metrics samples")
    ap.add_argument("--rss-growth-mb", type=float, default=64.0, help="RSS growth allowed after warm-up")
    ap.add_argument("--kv-budget-mb", type=int, default=64)
    ap.add_argument("--prefix-cache-mb", type=int, default=1, help="small, so that it fills (and evicts) during warm-up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the summary as JSON to this file ('-': stdout)")
    args = ap.parse_args()
    seconds = 120.0 if args.short else args.minutes * 60
    warmup = args.warmup if args.warmup is not None else (30.0 if args.short else seconds / 6)

    server = Server(args)
    soak = Soak(args, server)
    t0 = time.time()
    soak.stop_at = t0 + seconds
    threads = [threading.Thread(target=soak.client, args=(args.seed * 1000 + i,), daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    samples = []
    try:
        while time.time() < soak.stop_at:
            time.sleep(args.sample)
            if server.proc.poll() is not None:
                soak.note("server", False, f"the server exited with {server.proc.returncode}:\n{server.tail()}")
                break
            m = metrics(server.port)
            samples.append({"t": round(time.time() - t0, 1), "rss_mb": round(server.rss_mb() or 0, 1),
                            "running": m.get("mlxgen_running_sequences"), "kv_blocks": m.get("mlxgen_kv_blocks_in_use"),
                            "prefix_blocks": m.get("mlxgen_prefix_cache_blocks")})
        for t in threads:
            t.join(330)
        # Idle once every client is done: nothing queued or running, no KV block held.
        idle = None
        for _ in range(100):
            m = metrics(server.port)
            if m.get("mlxgen_queue_depth") == 0 and m.get("mlxgen_running_requests") == 0 and m.get("mlxgen_kv_blocks_in_use") == 0:
                idle = m
                break
            time.sleep(0.1)
        if idle is None:
            soak.note("leak", False, f"not idle after the run: {metrics(server.port)}")
        health = request(server.port, "GET", "/health", None, 10)
        if health[0] != 200:
            soak.note("health", False, f"/health {health[0]}: {health[1][:200]!r}")
    finally:
        server.stop()

    after = [s["rss_mb"] for s in samples if s["t"] >= warmup]
    q = max(1, len(after) // 4)
    base, end = (statistics.median(after[:q]), statistics.median(after[-q:])) if after else (None, None)
    growth = round(end - base, 1) if after else None
    if growth is None or growth > args.rss_growth_mb:
        soak.note("rss", False, f"RSS grew {growth} MB after warm-up (from {base} to {end} MB; limit {args.rss_growth_mb} MB)")
    answered = sum(v for k, v in soak.counts.items() if k.endswith(":ok"))
    summary = {"seconds": round(time.time() - t0, 1), "warmup_s": warmup, "clients": args.clients, "answers_ok": answered,
               "counts": dict(sorted(soak.counts.items())), "rss_after_warmup_mb": [base, end], "rss_growth_mb": growth,
               "rss_peak_mb": max((s["rss_mb"] for s in samples), default=None), "violations": soak.violations, "samples": samples}
    print(f"soak: {answered} answers as expected in {summary['seconds']} s; RSS after warm-up {base} -> {end} MB "
          f"(growth {growth} MB, limit {args.rss_growth_mb}); violations: {len(soak.violations)}", file=sys.stderr)
    for v in soak.violations:
        print(f"  {v}", file=sys.stderr)
    write_json(args.json, summary)
    return 0 if not soak.violations and answered > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
