"""The OpenAI-compatible server on 127.0.0.1, driven by real clients (the `openai` package, httpx).

One server process serves the module (starting one costs seconds on a 2-core CPU); it is
stopped with SIGINT at the end, and the test checks it exited.
"""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from reference import LLM, SamplingParams
from tests.serving.servers import MODEL, start_server

import openai  # noqa: E402  (a dev dependency: this module never skips)

MAX_MODEL_LEN = 2048
ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--num-kvcache-blocks", "256",
                "--max-num-batched-tokens", "2048"]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("serve"), *ENGINE_FLAGS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def offline(tiny_model_dir):
    return LLM(tiny_model_dir, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def test_openai_client_gets_the_offline_tokens(server, offline):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == [MODEL]
    prompt = [11, 22, 33, 44, 55, 66]
    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
    expected = offline.generate([prompt], greedy(12), use_tqdm=False)[0]
    assert done.choices[0].model_extra["token_ids"] == expected["token_ids"]
    assert done.choices[0].text == expected["text"] and done.usage.completion_tokens == 12

    messages = [{"role": "user", "content": "What is a KV cache?"}]
    templated = offline.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    chat_expected = offline.generate([templated], greedy(10), use_tqdm=False)[0]["text"]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == chat_expected
    streamed = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                              stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == chat_expected


def test_chat_content_as_text_parts_reads_as_their_texts_joined_by_newlines(server, offline):
    """OpenAI's list-of-parts `content` (the openai SDK's typed messages): vLLM joins text parts with "\\n"."""
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "a KV cache?"}]
    templated = offline.tokenizer.apply_chat_template([{"role": "user", "content": "What is\na KV cache?"}],
                                                      tokenize=False, add_generation_prompt=True)
    expected = offline.generate([templated], greedy(10), use_tqdm=False)[0]["text"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 10, "temperature": 0,
            "ignore_eos": True}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == expected


def test_32_concurrent_streaming_clients(server, offline):
    prompts = [f"request {i}: tell me about continuous batching" for i in range(32)]
    expected = [o["text"] for o in offline.generate(prompts, greedy(8), use_tqdm=False)]

    async def one(client, prompt):
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

    async def all_of_them():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        return await asyncio.gather(*(one(client, p) for p in prompts))

    assert asyncio.run(all_of_them()) == expected


def test_disconnect_aborts_and_frees_blocks(server):
    body = {"model": MODEL, "prompt": [7] * 40, "max_tokens": 2000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
            chunks = 0
            for line in response.iter_lines():
                chunks += line.startswith("data: ")
                if chunks == 3:
                    break                        # the client goes away mid-stream
    server.wait_idle()
    events = server.events()
    aborted = [e for e in events if e["event"] == "FINISHED" and e["reason"] == "abort"]
    assert len(aborted) == 1 and aborted[0]["num_output_tokens"] < 2000


@pytest.mark.parametrize("path, body, fragment", [
    ("chat/completions", {"model": MODEL}, "messages"),
    ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("completions", {"model": "gpt-4", "prompt": "hi"}, "does not exist"),
    ("completions", b"{not json", "not valid JSON"),
    ("completions", {"model": MODEL, "prompt": [5] * (MAX_MODEL_LEN + 5)}, "max_model_len"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is in"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages[0].content: part 1 is 'image_url'; this server takes text parts only"),
])
def test_bad_requests_get_400_and_the_server_keeps_serving(server, path, body, fragment):
    url = f"{server.url}/v1/{path}"
    response = httpx.post(url, content=body) if isinstance(body, bytes) else httpx.post(url, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error"
    ok = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_bench_serve_agrees_with_the_lifecycle_log(server, tmp_path):
    from courseware.bench_serve import plot, random_requests, sweep
    from reference.metrics import read_log, request_metrics

    seen = {e["seq_id"] for e in read_log(server.log) if e["event"] == "ARRIVED"}
    requests = random_requests(6, input_len=20, output_len=6, range_ratio=0.5, seed=1)
    report = asyncio.run(sweep(server.url, None, requests, [float("inf"), 30.0], 1.0, {"ttft": 10.0}))
    time.sleep(0.5)   # the engine flushes the log at the end of each step
    runs = report["runs"]
    assert [r["completed"] for r in runs] == [6, 6] and all(r["goodput"] is not None for r in runs)
    client = [r for run in runs for r in run["requests"]]
    assert [r["output_tokens"] for r in client] == [q.output_len for q in requests] * 2
    server_side = {k: m for k, m in request_metrics(read_log(server.log)).items() if k not in seen}
    assert len(server_side) == 12
    assert sorted(m.num_output_tokens for m in server_side.values()) == sorted(r["output_tokens"] for r in client)
    # The client's clock starts before the server's and stops after it.
    assert sum(r["ttft"] for r in client) >= sum(m.ttft for m in server_side.values())
    assert sum(r["e2el"] for r in client) >= sum(m.e2e for m in server_side.values())
    plot(report, str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_waiting_queue_limit_gives_503_with_retry_after(tiny_model_dir):
    from reference.engine.llm_engine import LLMEngine
    from reference.serving.api_server import build_app
    from reference.serving.engine_loop import EngineLoop, QueueFull

    engine = LLMEngine(tiny_model_dir, device="cpu", max_model_len=256, num_kvcache_blocks=32)

    async def fill():
        loop = EngineLoop(engine, max_waiting=2)        # not started: commands stay queued
        loop.submit([1, 2, 3], greedy(2), 0.0)
        loop.submit([1, 2, 3], greedy(2), 0.0)
        with pytest.raises(QueueFull, match="2 requests are already waiting"):
            loop.submit([1, 2, 3], greedy(2), 0.0)
    asyncio.run(fill())

    async def over_http():
        app = build_app(engine, MODEL, max_waiting=0, retry_after_s=3)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
    response = asyncio.run(over_http())
    assert response.status_code == 503 and response.headers["retry-after"] == "3"
    assert "retry later" in response.json()["error"]["message"]


def test_sharegpt_dataset_and_arrival_gaps(tmp_path):
    from courseware.bench_serve import arrival_gaps, sharegpt_requests

    data = [{"conversations": [{"from": "human", "value": "x" * 40}, {"from": "gpt", "value": "y" * 80}]},
            {"conversations": [{"from": "human", "value": "only a question"}]},          # no reply: skipped
            {"conversations": [{"from": "human", "value": "q" * 8}, {"from": "gpt", "value": "a" * 2}]}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    requests = sorted(sharegpt_requests(str(path), 10, seed=0), key=lambda r: r.prompt_len)
    assert [(r.prompt_len, r.output_len) for r in requests] == [(2, 1), (10, 20)]   # 4 characters a token, >= 1
    with pytest.raises(ValueError, match="ShareGPT"):
        path.write_text("[]")
        sharegpt_requests(str(path), 10, seed=0)
    gaps = arrival_gaps(20_000, rate=50.0, burstiness=1.0, seed=0)
    assert abs(sum(gaps) / len(gaps) - 1 / 50) < 0.001          # mean gap 1/rate
    assert arrival_gaps(3, float("inf"), 1.0, 0) == [0.0, 0.0, 0.0]
