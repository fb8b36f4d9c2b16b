#!/usr/bin/env python3
"""Load benchmark of an OpenAI-compatible server on loopback: `mlx-gen serve` and/or
`python -m mlx_lm.server` on the same model.

For each concurrency level (default 1, 8, 32) it fires that many streaming chat requests at once
(greedy, fixed max_tokens, distinct prompts) and reports, per level:
  agg_tok_s     all completion tokens / wall time from the first request sent to the last token
  decode_tok_s  completion tokens after each stream's first / time from the earliest first token
                to the last token (the aggregate decode rate, prefill mostly left out)
  stream_tok_s  the median of each stream's own decode rate
  ttft p50/p99  time to first token, in ms
as a table and as JSON (--json FILE, or stdout with --json -).

The stall regression (issue 20): `--rounds 10` also reports, per level, each round's worst TTFT,
the worst over all rounds and the median round's, and their ratio (`worst_vs_median_round`);
`--max-ttft-ratio 3` fails the run (exit 1) when the ratio is higher. `--long-every K` makes every
K-th stream's prompt `--long-prompt-words` long (short and long prompts mixed), `--stagger-ms`
spaces the streams' arrivals, so that newcomers' prefills meet running decodes, and `--vary-words`
lengthens every round's prompts, so that each round meets prompt and cache lengths not seen before
(a stall that is paid once per new shape shows in every round, not only the first):

  python3 scripts/bench/server_load.py --model PATH --server mlx-gen --concurrency 8 --rounds 10 \
      --long-every 4 --long-prompt-words 600 --stagger-ms 50 --vary-words 5 --max-ttft-ratio 3

Standard library only (http.client + threads), so it runs on a machine that has nothing but
python3 with mlx and mlx-lm. Loopback only: it starts the servers itself on 127.0.0.1, or talks to
--url, which must be a loopback address. Bounded: every request has a timeout, the whole run a
deadline, and the servers it started are stopped when it ends.

  python3 scripts/bench/server_load.py --model PATH [--server mlx-gen,mlx_lm] [--concurrency 1,8,32]
      [--max-tokens 128] [--prompt-words 48] [--rounds 1] [--mlx-gen BIN] [--json FILE]
      [--long-every K --long-prompt-words N] [--stagger-ms MS] [--max-ttft-ratio R]
      [--json-schema FILE]   (every request constrained to the schema: the cost of constrained streams)
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
TOPICS = ["a lighthouse keeper", "the moons of Jupiter", "a bakery at dawn", "an old violin", "a desert caravan",
          "the first snowfall", "a clockmaker's apprentice", "a ship in a bottle", "the northern lights", "a chess match",
          "a lost letter", "a mountain railway", "a coral reef", "a city library at night", "a river ferry", "a kite festival"]


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_mlx_gen():
    for p in ("target/release/mlx-gen", "target/debug/mlx-gen"):
        full = os.path.join(ROOT, p)
        if os.path.isfile(full):
            return full
    return shutil.which("mlx-gen") or "mlx-gen"


class Started:
    """A server this script started; stopped by stop()."""

    def __init__(self, kind, cmd, port, startup_timeout, keep_log=None):
        self.kind, self.port, self.keep_log = kind, port, keep_log
        self.log = tempfile.NamedTemporaryFile(prefix=f"server-load-{kind}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + startup_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind} exited with {self.proc.returncode} before serving:\n{self.tail()}")
            try:
                status, _ = get("127.0.0.1", port, "/health", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{kind} did not answer /health within {startup_timeout} s:\n{self.tail()}")

    def tail(self, n=30):
        try:
            with open(self.log.name, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.log.close()
        if self.keep_log:
            shutil.move(self.log.name, self.keep_log)
            print(f"[{self.kind}] server log: {self.keep_log}", file=sys.stderr)
        else:
            os.unlink(self.log.name)


def get(host, port, path, timeout):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def prompt_for(i, words):
    topic = TOPICS[i % len(TOPICS)]
    filler = " ".join(f"detail{(i * 7 + k) % 97}" for k in range(max(0, words - 12)))
    return f"Story {i}: write a long, vivid story about {topic}. Use these notes: {filler}"


def one_stream(host, port, prompt_index, args, api_key, words=None):
    """One streaming chat request: its timings and token count."""
    body = {"messages": [{"role": "user", "content": prompt_for(prompt_index, words or args.prompt_words)}], "max_tokens": args.max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    if args.model_field:
        body["model"] = args.model_field
    if args.json_schema:
        with open(args.json_schema) as f:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": json.load(f), "strict": True}}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    rec = {"ok": False, "tokens": 0, "chunks": 0, "error": None}
    t0 = time.perf_counter()
    rec["start"] = t0
    conn = None
    try:
        # A server with a short listen backlog (mlx_lm.server's is 5) resets some of many
        # simultaneous connections: those are retried, from the same start time, as a client would.
        for attempt in range(20):
            conn = http.client.HTTPConnection(host, port, timeout=args.request_timeout)
            try:
                conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
                r = conn.getresponse()
                break
            except (ConnectionResetError, ConnectionRefusedError, BrokenPipeError, http.client.RemoteDisconnected):
                conn.close()
                if attempt == 19:
                    raise
                rec["retries"] = rec.get("retries", 0) + 1
                time.sleep(0.05 * (attempt + 1))
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read()[:300]!r}"
            return rec
        usage = None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                rec["ok"] = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for ch in chunk.get("choices") or []:
                delta = ch.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                    now = time.perf_counter()
                    rec.setdefault("first", now)
                    rec["last"] = now
                    rec["chunks"] += 1
        rec["end"] = time.perf_counter()
        rec["tokens"] = usage["completion_tokens"] if usage else rec["chunks"]
        rec.setdefault("first", rec["end"])
        rec.setdefault("last", rec["end"])
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        if conn is not None:
            conn.close()
    return rec


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run_level(host, port, c, args, api_key, offset):
    """`rounds` rounds of c simultaneous streams; the level's numbers."""
    recs = []
    round_worst = []
    for r in range(args.rounds):
        out = [None] * c
        barrier = threading.Barrier(c)

        def client(i, first=offset + r * c):
            barrier.wait()
            if args.stagger_ms:
                time.sleep(i * args.stagger_ms / 1000)
            long = args.long_every and i % args.long_every == args.long_every - 1
            words = (args.long_prompt_words if long else args.prompt_words) + r * args.vary_words
            out[i] = one_stream(host, port, first + i, args, api_key, words)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(c)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.request_timeout + 30)
        recs.extend(x for x in out if x is not None)
        recs.extend({"ok": False, "error": "no answer in time", "tokens": 0} for x in out if x is None)
        firsts = [(x["first"] - x["start"]) * 1000 for x in out if x is not None and x["ok"]]
        if firsts:
            round_worst.append(round(max(firsts), 2))
    good = [x for x in recs if x["ok"]]
    level = {"concurrency": c, "requests": len(recs), "errors": len(recs) - len(good), "retries": sum(x.get("retries", 0) for x in recs),
             "error_samples": sorted({x["error"] for x in recs if x.get("error")})[:3]}
    if not good:
        return level
    ttft = [(x["first"] - x["start"]) * 1000 for x in good]
    total = sum(x["tokens"] for x in good)
    wall = max(x["end"] for x in good) - min(x["start"] for x in good)
    decode_span = max(x["last"] for x in good) - min(x["first"] for x in good)
    decode_tokens = sum(max(0, x["tokens"] - 1) for x in good)
    per_stream = [(x["tokens"] - 1) / (x["last"] - x["first"]) for x in good if x["tokens"] > 1 and x["last"] > x["first"]]
    level.update({
        "completion_tokens": total,
        "wall_s": round(wall, 4),
        "agg_tok_s": round(total / wall, 2) if wall > 0 else None,
        "decode_tok_s": round(decode_tokens / decode_span, 2) if decode_span > 0 else None,
        "stream_tok_s": round(statistics.median(per_stream), 2) if per_stream else None,
        "ttft_p50_ms": round(percentile(ttft, 0.5), 2),
        "ttft_p99_ms": round(percentile(ttft, 0.99), 2),
        "ttft_max_ms": round(max(ttft), 2),
    })
    if len(round_worst) > 1:
        median = statistics.median(round_worst)
        level.update({"round_worst_ttft_ms": round_worst, "worst_ttft_ms": max(round_worst), "median_round_ttft_ms": round(median, 2),
                      "worst_vs_median_round": round(max(round_worst) / median, 2) if median > 0 else None})
    return level


def bench_server(kind, host, port, args, api_key):
    # Warm-up: one short request, then a small batch (compiles the batched paths).
    warm = argparse.Namespace(**{**vars(args), "max_tokens": min(8, args.max_tokens)})
    for c in (1, min(4, max(args.levels))):
        run_level(host, port, c, warm, api_key, 10_000)
    levels = []
    started = time.time()
    for n, c in enumerate(args.levels):
        if time.time() - started > args.deadline:
            print(f"[{kind}] deadline of {args.deadline} s reached: skipping {c} streams", file=sys.stderr)
            break
        level = run_level(host, port, c, args, api_key, 1000 * (n + 1))
        level["server"] = kind
        levels.append(level)
        print(f"[{kind}] {c:>3} streams: {level.get('agg_tok_s')} tok/s aggregate, "
              f"TTFT p50 {level.get('ttft_p50_ms')} ms, errors {level['errors']}", file=sys.stderr)
        if "worst_vs_median_round" in level:
            print(f"[{kind}] {c:>3} streams over {args.rounds} rounds: worst TTFT {level['worst_ttft_ms']} ms, median round's "
                  f"{level['median_round_ttft_ms']} ms ({level['worst_vs_median_round']}x); rounds: {level['round_worst_ttft_ms']}", file=sys.stderr)
    return levels


def table(results):
    cols = ["server", "concurrency", "requests", "errors", "retries", "completion_tokens", "agg_tok_s", "decode_tok_s", "stream_tok_s",
            "ttft_p50_ms", "ttft_p99_ms"]
    rows = [[str(r.get(c, "")) if r.get(c) is not None else "-" for c in cols] for r in results]
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def write_json(path, doc):
    """`doc` as JSON to the file `path` ('-': stdout; None: nowhere)."""
    if path == "-":
        print(json.dumps(doc, indent=2))
    elif path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


def stop_on_sigterm(signum, frame):
    """`timeout` (and a device call's limit) ends this script with SIGTERM: exit through the `finally`
    blocks, so that the server it started stops too instead of running on (and holding the GPU) under
    the next measurement."""
    raise SystemExit(128 + signum)


def main():
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model folder (or repo id) both servers load")
    ap.add_argument("--server", default="mlx-gen,mlx_lm", help="comma list of mlx-gen, mlx_lm (default: both)")
    ap.add_argument("--url", help="bench an already running server at this loopback URL instead of starting one")
    ap.add_argument("--mlx-gen", default=default_mlx_gen(), help="the mlx-gen binary (default: target/release, then target/debug, then PATH)")
    ap.add_argument("--python", default=sys.executable, help="python with mlx-lm, for mlx_lm.server (default: this one)")
    ap.add_argument("--server-log", default="", help="keep each server's output (stdout and stderr) as PREFIX.KIND.log (e.g. mlx-gen's MLX_GEN_TRACE lines)")
    ap.add_argument("--mlx-gen-args", default="", help="extra arguments for mlx-gen serve (one string, split on spaces)")
    ap.add_argument("--mlx-lm-args", default="", help="extra arguments for mlx_lm.server")
    ap.add_argument("--api-key", default=None, help="bearer key for --url servers that need one")
    ap.add_argument("--model-field", default=None, help="send this as the request's `model` (default: none: the served one)")
    ap.add_argument("--concurrency", default="1,8,32", help="comma list of simultaneous streams (default 1,8,32)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=48, help="roughly the prompt's length in words")
    ap.add_argument("--rounds", type=int, default=1, help="rounds per level (more samples for the TTFT percentiles)")
    ap.add_argument("--long-every", type=int, default=0, help="every K-th stream of a round gets a long prompt (0: none)")
    ap.add_argument("--long-prompt-words", type=int, default=600, help="the long prompts' length in words")
    ap.add_argument("--stagger-ms", type=float, default=0.0, help="stream i of a round starts i times this later")
    ap.add_argument("--vary-words", type=int, default=0, help="round r's prompts are r times this many words longer (new shapes every round)")
    ap.add_argument("--json-schema", default=None, help="a JSON schema file: every request asks for it as response_format json_schema (constrained decoding; mlx-gen only)")
    ap.add_argument("--max-ttft-ratio", type=float, default=None, help="fail when a level's worst round TTFT is above this times the median round's")
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument("--deadline", type=float, default=1800.0, help="no new level starts after this many seconds per server")
    ap.add_argument("--json", "--out", dest="json", default=None, help="write the results as JSON to this file ('-': stdout)")
    args = ap.parse_args()
    args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if not args.levels or min(args.levels) < 1 or max(args.levels) > 256:
        ap.error("--concurrency: counts between 1 and 256")
    if args.rounds < 1 or args.max_tokens < 1:
        ap.error("--rounds and --max-tokens must be at least 1")

    results = []
    meta = {"model": args.model, "max_tokens": args.max_tokens, "prompt_words": args.prompt_words, "rounds": args.rounds,
            "long_every": args.long_every, "long_prompt_words": args.long_prompt_words, "stagger_ms": args.stagger_ms, "vary_words": args.vary_words,
            "levels": args.levels, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if args.url:
        u = urllib.parse.urlparse(args.url)
        if u.scheme != "http" or u.hostname not in LOOPBACK or not u.port:
            ap.error("--url must be http://127.0.0.1:PORT (loopback only)")
        results += bench_server("url", u.hostname, u.port, args, args.api_key)
    else:
        if not args.model:
            ap.error("--model is required (or --url)")
        for kind in [k.strip() for k in args.server.split(",") if k.strip()]:
            port = free_port()
            if kind == "mlx-gen":
                cmd = [args.mlx_gen, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", str(port)] + args.mlx_gen_args.split()
            elif kind in ("mlx_lm", "mlx-lm"):
                cmd = [args.python, "-m", "mlx_lm.server", "--model", args.model, "--host", "127.0.0.1", "--port", str(port)] + args.mlx_lm_args.split()
            else:
                ap.error(f"unknown server {kind!r}: mlx-gen or mlx_lm")
            print(f"[{kind}] starting: {' '.join(cmd)}", file=sys.stderr)
            keep = f"{args.server_log}.{kind}.log" if args.server_log else None
            server = Started(kind, cmd, port, args.startup_timeout, keep)
            try:
                results += bench_server(kind, "127.0.0.1", port, args, None)
            finally:
                server.stop()

    # Scaling against one stream, and mlx-gen against mlx_lm at each level.
    by = {(r["server"], r["concurrency"]): r for r in results}
    summary = {}
    for (kind, c), r in by.items():
        one = by.get((kind, 1), {}).get("agg_tok_s")
        if c > 1 and one and r.get("agg_tok_s"):
            summary[f"{kind} x{c} vs x1"] = round(r["agg_tok_s"] / one, 2)
        other = by.get(("mlx_lm", c), {}).get("agg_tok_s")
        if kind == "mlx-gen" and other and r.get("agg_tok_s"):
            summary[f"mlx-gen vs mlx_lm at {c}"] = round(r["agg_tok_s"] / other, 2)
    print(table(results))
    for k, v in summary.items():
        print(f"{k}: {v}x")
    doc = {"meta": meta, "results": results, "summary": summary}
    write_json(args.json, doc)
    stalled = [r for r in results if args.max_ttft_ratio and (r.get("worst_vs_median_round") or 0) > args.max_ttft_ratio]
    for r in stalled:
        print(f"[{r['server']}] {r['concurrency']} streams: worst round TTFT {r['worst_vs_median_round']}x the median round's "
              f"(limit {args.max_ttft_ratio}x)", file=sys.stderr)
    return 1 if any(r["errors"] for r in results) or stalled else 0


if __name__ == "__main__":
    sys.exit(main())
