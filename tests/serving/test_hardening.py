"""Issue 36 against a real `inferlab serve` on 127.0.0.1: one client cannot stall the server, what is not
supported is refused by name, every error is an OpenAI body, logprobs are the model's, /metrics has vLLM's set.

Expected values come from elsewhere: logprobs from transformers' own forward pass, tokens from the offline
engine, metric totals from the lifecycle log the server wrote. One server serves the module; every loop is
bounded in count and time.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import math
import socket
import threading
import time

import httpx
import pytest
import torch

from courseware.oracle import hf_model
from reference import LLM, SamplingParams
from tests.serving.servers import MODEL, start_server

MAX_MODEL_LEN = 2048
POOL_BLOCKS = 256
FLAGS = ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--num-kvcache-blocks", str(POOL_BLOCKS),
         "--max-num-batched-tokens", "2048"]
TOP = 3


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("hardening"), *FLAGS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def offline(tiny_model_dir):
    return LLM(tiny_model_dir, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN)


def post(server, path: str, body, client: httpx.Client | None = None, **kw) -> httpx.Response:
    send = client.post if client is not None else httpx.post
    if isinstance(body, (bytes, str)):
        return send(f"{server.url}/v1/{path}", content=body, headers={"content-type": "application/json"}, **kw)
    return send(f"{server.url}/v1/{path}", json=body, **kw)


def assert_openai_error(response: httpx.Response, status: int, param=None, fragment: str = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and fragment in error["message"]
    return error


# -- row 1: a client that leaves aborts its request --------------------------------------------------

def test_a_non_streaming_client_that_gives_up_aborts_its_request(server):
    body = {"model": MODEL, "prompt": [9] * 12, "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        post(server, "completions", body, timeout=httpx.Timeout(1.0, connect=10.0))
    left = time.perf_counter()      # the server's log uses the same monotonic clock (perf_counter)
    server.wait_idle()
    time.sleep(0.3)                 # the log file is flushed between steps
    events = server.events()
    (finished,) = [e for e in events if e["event"] == "FINISHED" and e["reason"] == "abort"
                   and any(a["event"] == "ARRIVED" and a["seq_id"] == e["seq_id"] and a["prompt_len"] == 12
                           for a in events)]
    assert finished["num_output_tokens"] < 2000
    assert finished["time"] - left < 2.0, "the request went on long after its client left"
    (freed,) = [e for e in events if e["event"] == "FREED" and e["seq_id"] == finished["seq_id"]]
    assert freed["blocks_freed"] > 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_before_its_first_token_aborts_its_request(server, stream):
    """The client sends its request and closes the socket at once: the request is aborted, not run to the end."""
    prompt_len = 13 + stream
    body = json.dumps({"model": MODEL, "prompt": [4] * prompt_len, "max_tokens": 2000, "temperature": 0,
                       "ignore_eos": True, "stream": stream}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
    server.wait_idle()
    time.sleep(0.3)
    events = server.events()
    arrived = [e["seq_id"] for e in events if e["event"] == "ARRIVED" and e["prompt_len"] == prompt_len]
    (finished,) = [e for e in events if e["event"] == "FINISHED" and e["seq_id"] in arrived]
    assert finished["reason"] == "abort" and finished["num_output_tokens"] < 2000


# -- row 2: size and cost limits before work ---------------------------------------------------------

class HealthProbe:
    """GET /health in a thread, as often as it answers, until stopped; records each answer's latency."""

    def __init__(self, url: str):
        self.url, self.latencies, self._stop = url, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set() and len(self.latencies) < 10_000:
                start = time.perf_counter()
                assert client.get(f"{self.url}/health").status_code == 200
                self.latencies.append(time.perf_counter() - start)
                time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(15)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_huge_requests_are_refused_before_work_and_health_stays_fast(server):
    before = rss_mb(server.proc.pid)
    text_mb = "hello world " * (10 * 2**20 // 12)
    bodies = [  # (body, status, fragment)
        (json.dumps({"model": MODEL, "prompt": text_mb}), 413, "larger than"),              # the 10 MB prompt
        (json.dumps({"model": MODEL, "prompt": text_mb[:900_000]}), 400, "at least"),       # bound: no tokenizing
        (json.dumps({"model": MODEL, "prompt": [5] * 300_000}), 400, "max_model_len"),      # 300k ids
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text_mb[:900_000]}]}), 400, "at least"),
        (json.dumps({"model": MODEL, "prompt": text_mb[:20_000]}), 400, "max_model_len"),   # tokenized, then refused
    ]
    with HealthProbe(server.url) as probe, httpx.Client(timeout=60) as client:
        time.sleep(0.2)
        for _ in range(2):
            for body, status, fragment in bodies:
                start = time.perf_counter()
                assert_openai_error(post(server, "completions" if "prompt" in body[:40] else "chat/completions",
                                         body, client), status, fragment=fragment,
                                    param=None if status == 413 else ("messages" if "messages" in body[:40]
                                                                      else "prompt"))
                assert time.perf_counter() - start < 10
        time.sleep(0.2)
    latencies = sorted(probe.latencies)
    assert len(latencies) > 20
    # The bound is the 100 ms; a loaded 2-core CI machine can delay any one answer, so 95% must
    # meet it and none may take a second (tokenizing a 10 MB prompt on the event loop blocked it for 9 s).
    assert latencies[int(0.95 * len(latencies))] < 0.1 and latencies[-1] < 1.0, latencies[-5:]
    time.sleep(0.5)
    assert rss_mb(server.proc.pid) - before < 60, "memory did not come back after the huge requests"
    ok = post(server, "completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200


# -- row 3: every error is an OpenAI body; the connection stays usable ---------------------------------

MALFORMED = [
    b'{"model": "tiny", "prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}",      # nested 3,000 deep (6 KB)
    b'{"model": "tiny", "prompt": ' + b"[" * 200 + b"]" * 200 + b"}",        # nested, but parseable
    b'{"model": "tiny", "messages": [{"role": "user", "content": ' + b'{"a": ' * 50 + b"1" + b"}" * 50 + b"}]}",
    b'{"model": "tiny", "prompt": "hi"',                                      # cut off
    b'{"model": "tiny", "prompt": "\xff\xfe"}',                               # not UTF-8
    b"[1, 2, 3]",
    b'"just a string"',
    b"",
]


def test_every_error_is_an_openai_body_and_the_connection_stays_usable(server):
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    ok = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2})

    def exchange(method: str, path: str, body: bytes | str | None = None) -> tuple[int, dict]:
        conn.request(method, path, body=body, headers={"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())

    exchange("POST", "/v1/completions", ok)
    sock = conn.sock
    cases = [("POST", "/v1/completions", body, 400) for body in MALFORMED]
    cases += [("POST", "/v1/chat/completions", body, 400) for body in MALFORMED[:2]]
    cases += [("GET", "/v1/nothing", None, 404), ("POST", "/v2/completions", ok, 404),
              ("GET", "/v1/completions", None, 405), ("DELETE", "/v1/chat/completions", None, 405)]
    for method, path, body, expected in cases:
        status, error_body = exchange(method, path, body)
        assert status == expected, (path, body[:60] if body else None, error_body)
        assert set(error_body["error"]) == {"message", "type", "param", "code"}
        assert error_body["error"]["type"] == "invalid_request_error"
        assert exchange("POST", "/v1/completions", ok)[0] == 200
        assert conn.sock is sock, f"the connection was closed after {method} {path}"
    conn.close()


def test_an_unexpected_failure_is_a_500_openai_body(tiny_model_dir):
    """A bug in the request path (here a tokenizer that raises) answers 500 with OpenAI's body."""
    from reference.engine.llm_engine import LLMEngine
    from reference.serving.api_server import build_app

    engine = LLMEngine(tiny_model_dir, device="cpu", max_model_len=256, num_kvcache_blocks=32)

    def broken(prompt):
        raise RuntimeError("a bug")
    engine.tokenize = broken

    async def over_http():
        app = build_app(engine, MODEL)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
                return await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
    error = assert_openai_error(asyncio.run(over_http()), 500, fragment="internal server error")
    assert error["type"] == "server_error"


# -- row 4: implement or refuse ------------------------------------------------------------------------

@pytest.mark.parametrize("path, field, value", [
    ("completions", "logit_bias", {"5": 3}),
    ("completions", "presence_penalty", 0.5),
    ("completions", "frequency_penalty", 1.0),
    ("completions", "best_of", 2),
    ("completions", "n", 2),
    ("completions", "stop", "\n"),
    ("completions", "suffix", "tail"),
    ("completions", "max_token", 5),              # a typo is refused, not ignored
    ("chat/completions", "n", 3),
    ("chat/completions", "stop", ["\n"]),
    ("chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("chat/completions", "response_format", {"type": "json_object"}),
    ("chat/completions", "repetition_penalty", 1.2),
])
def test_unsupported_fields_are_refused_by_name(server, path, field, value):
    body = {"model": MODEL, "max_tokens": 2, field: value}
    body.update({"prompt": "hi"} if path == "completions" else {"messages": [{"role": "user", "content": "hi"}]})
    assert_openai_error(post(server, path, body), 400, param=field, fragment=f"{field}: not supported")


@pytest.mark.parametrize("path, extra, param", [
    ("chat/completions", {"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages[0].name"),
    ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("completions", {"prompt": "hi", "echo": True, "logprobs": 1}, "echo"),
    ("completions", {"prompt": ["a", "b"]}, "prompt"),
    ("completions", {"prompt": [1, "x"]}, "prompt"),
    ("completions", {"prompt": "hi", "logprobs": 30}, "logprobs"),
    ("completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("completions", {"prompt": "hi", "stop_token_ids": [10**6]}, "stop_token_ids"),
    ("completions", {"prompt": "hi", "top_k": -1}, "top_k"),
    ("completions", {"prompt": "hi", "stream": True, "stream_options": {"continuous_usage_stats": True}},
     "stream_options.continuous_usage_stats"),
])
def test_bad_values_name_their_param(server, path, extra, param):
    assert_openai_error(post(server, path, {"model": MODEL, **extra}), 400, param=param)


def test_values_that_ask_for_nothing_are_accepted(server, offline):
    neutral = {"n": 1, "best_of": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
               "stop": None, "suffix": None, "user": "someone", "echo": False, "logprobs": None}
    prompt = [11, 22, 33]
    response = post(server, "completions", {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                                            "ignore_eos": True, **neutral})
    assert response.status_code == 200, response.text
    expected = offline.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                                use_tqdm=False)[0]["token_ids"]
    assert response.json()["choices"][0]["token_ids"] == expected


def reference_logprobs(model_dir: str, prompt: list[int], output: list[int]) -> torch.Tensor:
    """log-softmax of transformers' logits at each position that predicted an output token."""
    with torch.no_grad():
        logits = hf_model(model_dir)(torch.tensor([prompt + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1:len(prompt) - 1 + len(output)], dim=-1)


def sse_chunks(response: httpx.Response) -> list[dict]:
    lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_are_the_models_log_softmax(server, tiny_model_dir, offline, stream):
    prompt = [17, 250, 31, 400, 5, 77]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "logprobs": TOP, "stream": stream}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as response:
        choices = [c["choices"][0] for c in sse_chunks(response)] if stream else None
        if not stream:
            response.read()
            choices = [response.json()["choices"][0]]
    token_ids = [t for c in choices for t in c["token_ids"]]
    logprobs = {key: [v for c in choices for v in c["logprobs"][key]] for key in choices[0]["logprobs"]}
    assert token_ids == offline.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
                                         use_tqdm=False)[0]["token_ids"]
    expected = reference_logprobs(tiny_model_dir, prompt, token_ids)
    assert logprobs["tokens"] == [offline.tokenizer.decode([t]) for t in token_ids]
    for token, lp, top, row in zip(token_ids, logprobs["token_logprobs"], logprobs["top_logprobs"], expected):
        assert lp == pytest.approx(row[token].item(), abs=1e-4)
        best = row.topk(TOP).values.tolist()
        # Text -> logprob for the top entries plus the sampled token (two tokens with one text share a key).
        allowed = best + [lp]
        assert all(any(abs(v - a) < 1e-4 for a in allowed) for v in top.values()) and len(top) <= TOP + 1
        assert max(top.values()) == pytest.approx(best[0], abs=1e-4)
    offsets = logprobs["text_offset"]
    assert offsets == [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(len(token_ids))]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_are_the_models_log_softmax(server, tiny_model_dir, offline, stream):
    messages = [{"role": "user", "content": "What is a KV cache?"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "logprobs": True, "top_logprobs": TOP, "stream": stream}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as response:
        if stream:
            content = [e for c in sse_chunks(response) for e in c["choices"][0]["logprobs"]["content"]]
        else:
            response.read()
            content = response.json()["choices"][0]["logprobs"]["content"]
    templated = offline.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = offline.tokenize(templated)
    output = offline.generate([prompt], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
                              use_tqdm=False)[0]["token_ids"]
    expected = reference_logprobs(tiny_model_dir, prompt, output)
    assert [e["token"] for e in content] == [offline.tokenizer.decode([t]) for t in output]
    for entry, token, row in zip(content, output, expected):
        assert entry["logprob"] == pytest.approx(row[token].item(), abs=1e-4)
        assert entry["bytes"] == list(entry["token"].encode("utf-8"))
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(row.topk(TOP).values.tolist(),
                                                                                abs=1e-4)


def test_echo_puts_the_prompt_before_the_completion(server):
    body = {"model": MODEL, "prompt": "The cache", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    plain = post(server, "completions", body).json()["choices"][0]["text"]
    echoed = post(server, "completions", {**body, "echo": True}).json()["choices"][0]["text"]
    assert echoed == "The cache" + plain
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "echo": True, "stream": True}) as r:
        assert "".join(c["choices"][0]["text"] for c in sse_chunks(r)) == echoed


# -- row 7: vLLM's metric set --------------------------------------------------------------------------

def histogram(server, name: str) -> tuple[float, float]:
    return server.metric(f"{name}_count"), server.metric(f"{name}_sum")


def test_metrics_agree_with_the_lifecycle_log(server):
    """Preemptions, prefix-cache lookups, phase times and length histograms, against totals computed from the log."""
    shared = list(range(100, 164))                 # 4 full blocks that a later request finds in the cache
    requests = [{"prompt": shared + [7] * 20, "max_tokens": 10},
                {"prompt": shared + [8] * 30, "max_tokens": 10}]
    for body in requests:                          # one after the other: the second one hits the first's blocks
        assert post(server, "completions", {"model": MODEL, "temperature": 0, "ignore_eos": True, **body},
                    timeout=60).status_code == 200

    async def crowd():                             # 4 x 75 blocks do not fit the pool of 256: preemptions
        async with httpx.AsyncClient(timeout=120) as client:
            bodies = [{"model": MODEL, "prompt": [40 + i] * 600, "max_tokens": 600, "temperature": 0,
                       "ignore_eos": True} for i in range(4)]
            return await asyncio.gather(*(client.post(f"{server.url}/v1/completions", json=b) for b in bodies))
    assert all(r.status_code == 200 for r in asyncio.run(crowd()))
    server.wait_idle()
    time.sleep(0.3)
    events = server.events()

    by_seq: dict[int, list[dict]] = {}
    for e in events:
        if e["seq_id"] is not None:
            by_seq.setdefault(e["seq_id"], []).append(e)
    done = [evs for evs in by_seq.values() if evs[-1]["event"] == "FREED"]
    assert sum(e["event"] == "PREEMPTED" for e in events) == server.metric("num_preemptions_total") > 0
    first_admissions = [(evs[0]["prompt_len"], evs[2]["num_cached_tokens"]) for evs in by_seq.values()
                        if len(evs) > 2 and evs[2]["event"] == "SCHEDULED"]
    assert server.metric("prefix_cache_queries_total") == sum(q for q, _ in first_admissions)
    assert server.metric("prefix_cache_hits_total") == sum(h for _, h in first_admissions) >= 64

    def times(evs):
        scheduled = next(e["time"] for e in evs if e["event"] == "SCHEDULED")
        tokens = [e["time"] for e in evs if e["event"] in ("FIRST_TOKEN", "TOKEN")]
        return tokens[0] - scheduled, tokens[-1] - tokens[0]
    with_tokens = [times(evs) for evs in done if any(e["event"] == "FIRST_TOKEN" for e in evs)]
    count, total = histogram(server, "request_prefill_time_seconds")
    assert count == len(with_tokens) and math.isclose(total, sum(p for p, _ in with_tokens), abs_tol=1e-6)
    count, total = histogram(server, "request_decode_time_seconds")
    assert count == len(with_tokens) and math.isclose(total, sum(d for _, d in with_tokens), abs_tol=1e-6)
    count, total = histogram(server, "request_prompt_tokens")
    assert count == len(done) and total == sum(evs[0]["prompt_len"] for evs in done)
    count, total = histogram(server, "request_generation_tokens")
    assert total == sum(e["num_output_tokens"] for evs in done for e in evs if e["event"] == "FINISHED")
    assert server.metric("request_prompt_tokens_bucket", le="2000.0") == len(done)   # 1-2-5 buckets


# -- acceptance: bench serve with disconnecting clients -------------------------------------------------

def test_bench_serve_with_disconnecting_clients_leaks_nothing_and_keeps_greedy_tokens(server, offline):
    from courseware.bench_serve import random_requests, sweep

    requests = random_requests(64, input_len=24, output_len=16, range_ratio=0.5, seed=3)
    report = asyncio.run(sweep(server.url, MODEL, requests, [float("inf")], 1.0, {}, disconnect=16))
    (run,) = report["runs"]
    assert run["completed"] == 64 and run["failed"] == 0 and run["disconnected"] == 16
    assert run["server_after"] == {"idle": True, "kv_cache_usage_perc": 0.0, "aborted": 16.0}
    expected = offline.generate([r.prompt for r in requests],
                                [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
                                 for r in requests], use_tqdm=False)
    assert [r["token_ids"] for r in run["requests"]] == [e["token_ids"] for e in expected]
