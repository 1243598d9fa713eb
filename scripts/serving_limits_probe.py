"""What one huge request costs everybody else: /health latency, memory, and an idle exit, on a real server.

    python scripts/serving_limits_probe.py [--model DIR] [--rounds 3]

Starts `inferlab serve` (the tiny model unless --model, float32, max_model_len 2048, 256 KV
blocks) on a free 127.0.0.1 port, then for each kind of oversized body (a 10 MB prompt string,
bodies just under the 1 MiB limit as text, token ids and chat, and a 20 KB prompt that is
tokenized before it is refused) sends it --rounds times while a second process asks /health
every 5 ms, and prints that prober's latencies, the server's answer and its RSS before and
after. Last, SIGINT to the idle server and the seconds until it exited. docs/serving.md has the
figures it printed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROBER = """
import sys, time, httpx
url, seconds, lat = sys.argv[1], float(sys.argv[2]), []
with httpx.Client(timeout=30) as c:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end and len(lat) < 100000:
        t = time.perf_counter()
        try:
            c.get(url)
        except httpx.TimeoutException:   # no answer in 30 s: counted as 30 s
            pass
        lat.append(time.perf_counter() - t); time.sleep(0.005)
lat.sort()
print(len(lat), lat[len(lat) // 2], lat[int(len(lat) * 0.95)], lat[-1])
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    model = [args.model] if args.model else []
    server = subprocess.Popen([sys.executable, "-m", "inferlab.cli", "serve", *model, "--port", str(port),
                               "--served-model-name", "m", "--dtype", "float32", "--max-model-len", "2048",
                               "--num-kvcache-blocks", "256"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            print("the server did not start")
            return 1
        httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}, timeout=60)
        text = "hello world " * (10 * 2**20 // 12)
        bodies = {"10 MB prompt string": {"model": "m", "prompt": text},
                  "0.9 MB prompt string": {"model": "m", "prompt": text[:900_000]},
                  "0.9 MB of token ids": {"model": "m", "prompt": [5] * 300_000},
                  "0.9 MB chat message": {"model": "m", "messages": [{"role": "user", "content": text[:900_000]}]},
                  "20 KB prompt (tokenized)": {"model": "m", "prompt": text[:20_000]}}
        before = rss_mb(server.pid)
        print(f"server RSS before: {before:.0f} MB")
        print(f"{'body':26} {'answer':>6} {'s/answer':>9} {'health n':>9} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7}")
        with httpx.Client(timeout=120) as client:
            for name, body in bodies.items():
                data = json.dumps(body).encode()
                path = "chat/completions" if "messages" in body else "completions"
                prober = subprocess.Popen([sys.executable, "-c", PROBER, f"{url}/health", "3"],
                                          stdout=subprocess.PIPE, text=True)
                time.sleep(0.8)
                took, status = [], None
                for _ in range(args.rounds):
                    start = time.perf_counter()
                    status = client.post(f"{url}/v1/{path}", content=data,
                                         headers={"content-type": "application/json"}).status_code
                    took.append(time.perf_counter() - start)
                n, p50, p95, worst = prober.communicate(timeout=60)[0].split()
                print(f"{name:26} {status:>6} {max(took):9.2f} {n:>9} {float(p50) * 1e3:7.1f} "
                      f"{float(p95) * 1e3:7.1f} {float(worst) * 1e3:7.1f}")
        time.sleep(1)
        print(f"server RSS after: {rss_mb(server.pid):.0f} MB")
        start = time.monotonic()
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
        print(f"idle SIGINT to exit: {time.monotonic() - start:.2f} s (exit code {server.returncode})")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    print(f"load average after: {os.getloadavg()[0]:.1f} (2 cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
