"""Issue 36, rows 5 and 6: a server that cannot serve one max_model_len request does not start; a server
told to stop ends every stream with a last chunk and [DONE], writes no traceback, and exits promptly.

Each test starts its own `inferlab serve` on 127.0.0.1 (they end it); every wait is bounded.
"""
from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest

from tests.serving.servers import MODEL, start_server

FLAGS = ["--dtype", "float32", "--max-model-len", "2048", "--num-kvcache-blocks", "256"]
NOISE = ("Traceback", "CancelledError", "ERROR", "Exception")


def test_a_kv_pool_that_cannot_hold_one_request_is_refused_at_startup(tiny_model_dir, tmp_path):
    server = start_server(tiny_model_dir, tmp_path, "--max-model-len", "2048", "--num-kvcache-blocks", "48",
                          wait=False)
    assert server.proc.wait(timeout=120) == 2
    text = server.text()
    # 2,047 stored tokens need 128 blocks of 16; the pool holds 48 (768 tokens).
    assert "48 blocks" in text and "768 tokens" in text and "needs 128 blocks" in text, text
    assert "Traceback" not in text


async def stream(url: str, prompt: list[int], max_tokens: int, started: asyncio.Event) -> list[dict | str]:
    """One streamed completion: its chunks (parsed) and the final `[DONE]`; sets `started` at the first chunk."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    received: list[dict | str] = []
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    data = line[len("data: "):]
                    received.append(data if data == "[DONE]" else json.loads(data))
                    started.set()
    return received


def test_sigterm_drains_then_ends_every_stream_with_a_last_chunk_and_done(tiny_model_dir, tmp_path):
    drain = 2.0
    server = start_server(tiny_model_dir, tmp_path, *FLAGS, "--drain-timeout", str(drain))

    async def scenario():
        events = [asyncio.Event() for _ in range(8)]
        # 4 streams that finish well inside the drain, 4 that would run far past it.
        tasks = [asyncio.create_task(stream(server.url, [10 + i] * 16, 20 if i < 4 else 1800, events[i]))
                 for i in range(8)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 60)
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        with pytest.raises(httpx.ConnectError):     # it stopped accepting
            async with httpx.AsyncClient() as client:
                await client.get(f"{server.url}/health")
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        return results, time.monotonic() - signalled
    results, ended_after = asyncio.run(scenario())
    assert server.stop(timeout=30) < 30
    for i, chunks in enumerate(results):
        assert chunks[-1] == "[DONE]"
        last = chunks[-2]["choices"][0]
        assert last["finish_reason"] == ("length" if i < 4 else "abort")
        if i < 4:
            assert sum(len(c["choices"][0]["token_ids"]) for c in chunks[:-1]) == 20
    assert drain - 0.5 < ended_after < drain + 10
    assert server.proc.returncode in (0, -signal.SIGTERM)   # uvicorn re-raises the signal it stopped for
    assert not any(word in server.text() for word in NOISE), server.text()
    aborted = [e for e in server.events() if e["event"] == "FINISHED" and e["reason"] == "abort"]
    assert len(aborted) == 4


def test_an_idle_server_exits_within_2_s_of_sigint(tiny_model_dir, tmp_path):
    server = start_server(tiny_model_dir, tmp_path, *FLAGS)
    with httpx.Client() as client:    # a client that keeps its connection open must not hold the exit up
        ok = client.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200
        time.sleep(0.5)
        took = server.stop(signal.SIGINT, timeout=30)
    assert took < 2.0, f"exit took {took:.2f} s"
    assert server.proc.returncode == 0
    assert not any(word in server.text() for word in NOISE), server.text()
