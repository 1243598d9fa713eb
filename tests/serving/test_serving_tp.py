"""`inferlab serve --tensor-parallel-size 2` on the CPU (gloo): the tokens of one process, and no worker left.

A server of its own (the main serving suite's runs at TP=1): the engine thread
drives rank 0, whose worker process runs the other half of the model.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from reference import LLM, SamplingParams

MODEL = "tiny"
ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "256", "--num-kvcache-blocks", "64",
                "--max-num-batched-tokens", "256", "--tensor-parallel-size", "2", "--async-scheduling"]


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the worker's pid from /proc")
def test_tp2_server_serves_tp1s_tokens_and_exits_with_its_worker(tiny_model_dir):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "inferlab.cli", "serve", tiny_model_dir, "--port", str(port),
                             "--served-model-name", MODEL, "--device", "cpu", *ENGINE_FLAGS],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, f"server did not start:\n{proc.stdout.read()}"
            time.sleep(0.3)
        workers = [c for c in children(proc.pid) if "inferlab-tp" in Path(f"/proc/{c}/cmdline").read_text()
                   or "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]
        prompts = [[11, 22, 33, 44, 55, 66], list(range(100, 140)), [7] * 17, [3, 1, 4, 1, 5, 9, 2, 6]]
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        expected = [o["token_ids"] for o in LLM(tiny_model_dir, device="cpu", dtype="float32", max_model_len=256,
                                                 num_kvcache_blocks=64).generate(prompts, params, use_tqdm=False)]

        async def one(client, prompt):
            done = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0,
                                                   extra_body={"ignore_eos": True})
            return done.choices[0].model_extra["token_ids"]

        async def all_at_once():
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            return await asyncio.gather(*(one(client, p) for p in prompts))

        assert asyncio.run(all_at_once()) == expected
        assert workers, "no worker process found under the server"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                pytest.fail("the TP=2 server did not exit within 30 s of SIGINT")
    deadline = time.monotonic() + 10
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(w) for w in workers), "the server's worker outlived it"
