"""`inferlab bench serve`: an online load against an OpenAI-compatible server, as `vllm bench serve` does.

Requests arrive as a Poisson process at each `--request-rate` (gaps drawn from
a gamma distribution whose shape is `--burstiness`: 1 is Poisson, below 1
burstier), stream their tokens over SSE, and are measured from the client's
side, with the definitions vLLM's benchmark uses:

- TTFT: request sent to the first chunk carrying a token;
- ITL: gaps between consecutive token-carrying chunks;
- TPOT: (E2EL - TTFT) / (output tokens - 1), per request (0 with one token);
- E2EL: request sent to the last chunk;
- request and output throughput: completed requests and output tokens over the run's wall time;
- goodput: completed requests meeting every SLO given (`--goodput ttft:500 tpot:50 e2el:5000`, ms),
  over the wall time.

For robustness runs, `--disconnect N` adds N clients per rate that go away
after their first token (their requests must be aborted), and after each rate
the server's /metrics are read once it is idle: nothing may still run or hold
KV blocks. Every request records its token ids; `--compare-tokens FILE` checks
them against an earlier report of the same requests (greedy requests must get
the same tokens whatever else the server was doing).
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from reference.metrics import distribution

RANDOM_TOKEN_RANGE = 1000   # random prompts use ids below this: valid for any vocabulary the engine serves
SLO_KEYS = ("ttft", "tpot", "e2el")
LEAVER_OUTPUT_FACTOR = 8


@dataclass
class BenchRequest:
    prompt: str | list[int]
    prompt_len: int
    output_len: int


@dataclass
class RequestResult:
    success: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2el: float | None = None
    error: str | None = None
    token_ids: list[int] = field(default_factory=list)

    @property
    def tpot(self) -> float:
        if self.output_tokens < 2 or self.e2el is None or self.ttft is None:
            return 0.0
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


# -- datasets ---------------------------------------------------------------------------

def random_requests(n: int, input_len: int, output_len: int, range_ratio: float, seed: int) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)

    def lengths(mean: int) -> np.ndarray:
        low, high = max(1, int(mean * (1 - range_ratio))), max(1, int(mean * (1 + range_ratio)))
        return rng.integers(low, high + 1, size=n)

    ins, outs = lengths(input_len), lengths(output_len)
    return [BenchRequest(rng.integers(0, RANDOM_TOKEN_RANGE, size=int(i)).tolist(), int(i), int(o))
            for i, o in zip(ins, outs)]


def sharegpt_requests(path: str, n: int, seed: int) -> list[BenchRequest]:
    """First human turn as the prompt, the first reply's length as the output length.

    Without the server's tokenizer on the client, lengths are estimated as one
    token per 4 characters (the usual rule for English), at least 1.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    pairs = []
    for item in data:
        turns = item.get("conversations") or item.get("conversation") or []
        if len(turns) >= 2 and turns[0].get("value") and turns[1].get("value"):
            pairs.append((turns[0]["value"], turns[1]["value"]))
    if not pairs:
        raise ValueError(f"{path}: no conversation with a prompt and a reply (ShareGPT format expected)")
    rng = np.random.default_rng(seed)
    picked = [pairs[i] for i in rng.permutation(len(pairs))[:n]]
    return [BenchRequest(prompt, max(1, len(prompt) // 4), max(1, len(reply) // 4)) for prompt, reply in picked]


# -- one request ------------------------------------------------------------------------

async def send(client: httpx.AsyncClient, url: str, model: str, req: BenchRequest,
               leave_after_first_token: bool = False) -> RequestResult:
    """One streamed request, timed; `leave_after_first_token` closes the connection once a token came."""
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    result = RequestResult(success=False, prompt_len=req.prompt_len)
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    result.prompt_len = chunk["usage"]["prompt_tokens"]
                if not chunk.get("choices") or not chunk["choices"][0].get("token_ids"):
                    continue
                now = time.perf_counter()
                if result.ttft is None:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
                result.output_tokens += len(chunk["choices"][0]["token_ids"])
                result.token_ids += chunk["choices"][0]["token_ids"]
                if leave_after_first_token:
                    break
        result.e2el = last - start
        result.success = result.output_tokens > 0
    except httpx.HTTPError as err:
        result.error = f"{type(err).__name__}: {err}"
    return result


# -- one rate ---------------------------------------------------------------------------

def arrival_gaps(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds to wait before each request: gamma gaps with mean 1/rate (all zero at rate inf)."""
    if math.isinf(rate):
        return [0.0] * n
    theta = 1.0 / (rate * burstiness)
    return np.random.default_rng(seed).gamma(burstiness, theta, size=n).tolist()


async def run_rate(url: str, model: str, requests: list[BenchRequest], rate: float, burstiness: float,
                   seed: int, max_concurrency: int | None, disconnect: int = 0
                   ) -> tuple[list[RequestResult], list[RequestResult], float]:
    """The requests at `rate`, plus `disconnect` clients that leave after their first token; returns
    (results, leavers' results, seconds). A leaver sends a copy of one of the requests, with arrivals spread
    among the others, asking for LEAVER_OUTPUT_FACTOR times its output: only an abort ends it early."""
    total = len(requests) + disconnect
    limit = asyncio.Semaphore(max_concurrency or total)
    timeout = httpx.Timeout(None, connect=30.0)
    leaving = {int(k * total / disconnect) for k in range(disconnect)}
    staying = iter(requests)
    copies = iter([replace(r, output_len=r.output_len * LEAVER_OUTPUT_FACTOR)
                   for r in requests * (disconnect // len(requests) + 1)])
    order = [(next(copies), True) if i in leaving else (next(staying), False) for i in range(total)]

    async def limited(client, req, leave):
        async with limit:
            return await send(client, url, model, req, leave_after_first_token=leave)

    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=None)) as client:
        tasks = []
        start = time.perf_counter()
        for (req, leave), gap in zip(order, arrival_gaps(len(order), rate, burstiness, seed)):
            await asyncio.sleep(gap)
            tasks.append((asyncio.create_task(limited(client, req, leave)), leave))
        results = [(await task, leave) for task, leave in tasks]
        duration = time.perf_counter() - start
    return [r for r, leave in results if not leave], [r for r, leave in results if leave], duration


async def server_metrics(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The server's /metrics samples this report uses, summed over labels (vLLM's names or ours)."""
    values: dict[str, float] = {}
    text = (await client.get(f"{url}/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.split(":", 1)[-1]
            if name == "request_success_total":
                name = f"finished_{sample.labels.get('finished_reason')}"
            values[name] = values.get(name, 0.0) + sample.value
    return values


async def idle_server(url: str, before: dict[str, float], timeout_s: float = 30.0) -> dict:
    """Once nothing runs or waits: what the server still holds, and how many requests it aborted since `before`."""
    async with httpx.AsyncClient() as client:
        deadline = time.monotonic() + timeout_s
        while True:
            now = await server_metrics(client, url)
            idle = not now.get("num_requests_running") and not now.get("num_requests_waiting")
            if idle or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    return {"idle": idle, "kv_cache_usage_perc": now.get("kv_cache_usage_perc"),
            "aborted": now.get("finished_abort", 0.0) - before.get("finished_abort", 0.0)}


def parse_slos(items: list[str]) -> dict[str, float]:
    """`ttft:500 tpot:50` -> {"ttft": 0.5, "tpot": 0.05} (seconds)."""
    slos = {}
    for item in items:
        key, _, value = item.partition(":")
        if key not in SLO_KEYS or not value:
            raise ValueError(f"--goodput {item!r}: expected KEY:MS with KEY one of {', '.join(SLO_KEYS)}")
        slos[key] = float(value) / 1000.0
    return slos


def summarize_rate(rate: float, results: list[RequestResult], duration: float, slos: dict[str, float],
                   leavers: list[RequestResult] = (), server_after: dict | None = None) -> dict:
    done = [r for r in results if r.success]

    def stats(values) -> dict:
        d = distribution(values)
        return {"mean": d["mean"], "median": d["p50"], "p99": d["p99"]}

    good = [r for r in done if all(getattr(r, "e2el" if k == "e2el" else k) <= v for k, v in slos.items())]
    return {"request_rate": rate, "duration_s": duration, "completed": len(done), "failed": len(results) - len(done),
            "errors": sorted({r.error for r in results if r.error})[:5],
            "total_output_tokens": sum(r.output_tokens for r in done),
            "request_throughput": len(done) / duration, "output_throughput": sum(r.output_tokens for r in done) / duration,
            "goodput": len(good) / duration if slos else None, "slos_s": slos,
            "ttft_s": stats(r.ttft for r in done), "tpot_s": stats(r.tpot for r in done),
            "itl_s": stats(x for r in done for x in r.itls), "e2el_s": stats(r.e2el for r in done),
            "disconnected": len(leavers), "server_after": server_after,
            "requests": [asdict(r) for r in results]}


async def sweep(url: str, model: str | None, requests: list[BenchRequest], rates: list[float], burstiness: float,
                slos: dict[str, float], seed: int = 0, max_concurrency: int | None = None,
                disconnect: int = 0) -> dict:
    """Run the same requests at each rate in turn; returns the JSON-ready report."""
    if model is None:
        async with httpx.AsyncClient() as client:
            model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
    runs = []
    for rate in rates:
        async with httpx.AsyncClient() as client:
            before = await server_metrics(client, url)
        results, leavers, duration = await run_rate(url, model, requests, rate, burstiness, seed, max_concurrency,
                                                    disconnect)
        after = await idle_server(url, before)
        runs.append(summarize_rate(rate, results, duration, slos, leavers, after))
    return {"url": url, "model": model, "num_prompts": len(requests), "burstiness": burstiness, "runs": runs}


def compare_tokens(report: dict, earlier: dict) -> tuple[int, int]:
    """(equal, compared): completed requests of each run whose token ids equal the same request's in
    `earlier`'s first run (the same dataset and seed make the same requests, in the same order)."""
    reference = [r["token_ids"] if r["success"] else None for r in earlier["runs"][0]["requests"]]
    equal = compared = 0
    for run in report["runs"]:
        for got, expected in zip(run["requests"], reference):
            if got["success"] and expected is not None:
                compared += 1
                equal += got["token_ids"] == expected
    return equal, compared


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in report["runs"] if not math.isinf(r["request_rate"])] or report["runs"]
    x = [r["request_throughput"] if math.isinf(r["request_rate"]) else r["request_rate"] for r in runs]
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2el_s", "E2EL")):
        lat.plot(x, [r[key]["median"] for r in runs], marker="o", label=f"{label} median")
        lat.plot(x, [r[key]["p99"] for r in runs], marker="x", linestyle="--", label=f"{label} p99")
    lat.set(xlabel="request rate (req/s)", ylabel="seconds", yscale="log", title="latency vs rate")
    lat.legend(fontsize=7)
    thr.plot(x, [r["request_throughput"] for r in runs], marker="o", label="throughput")
    if runs[0]["goodput"] is not None:
        thr.plot(x, [r["goodput"] for r in runs], marker="s", label="goodput")
    thr.plot(x, x, color="grey", linestyle=":", label="offered load")
    thr.set(xlabel="request rate (req/s)", ylabel="requests/s", title="throughput and goodput vs rate")
    thr.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_bench_serve_cli(args) -> int:
    from rich.console import Console
    from rich.table import Table

    if args.dataset == "sharegpt":
        if not args.dataset_path:
            raise ValueError("--dataset sharegpt needs --dataset-path FILE")
        requests = sharegpt_requests(args.dataset_path, args.num_prompts, args.seed)
    else:
        requests = random_requests(args.num_prompts, args.random_input_len, args.random_output_len,
                                   args.random_range_ratio, args.seed)
    url = args.url.rstrip("/")
    try:
        report = asyncio.run(sweep(url, args.served_model_name, requests, args.request_rate, args.burstiness,
                                   parse_slos(args.goodput), args.seed, args.max_concurrency, args.disconnect))
    except httpx.TransportError as err:        # each request's own errors are counted in its run, not raised
        raise ConnectionError(f"no answer from the server at {url} ({type(err).__name__}: {err}): start one with "
                              "`inferlab serve`, or name it with --url") from None
    table = Table(title=f"bench serve: {report['model']} at {report['url']}")
    for col in ("rate", "done", "req/s", "out tok/s", "goodput", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
                "E2EL p50/p99 s", "left/aborted", "KV after"):
        table.add_column(col, justify="right")
    for r in report["runs"]:
        after = r["server_after"]
        ms = lambda d: "-" if d["median"] is None else f"{d['median'] * 1e3:.0f}/{d['p99'] * 1e3:.0f}"  # noqa: E731
        table.add_row(f"{r['request_rate']:g}", f"{r['completed']}/{r['completed'] + r['failed']}",
                      f"{r['request_throughput']:.2f}", f"{r['output_throughput']:.0f}",
                      "-" if r["goodput"] is None else f"{r['goodput']:.2f}", ms(r["ttft_s"]), ms(r["tpot_s"]),
                      "-" if r["e2el_s"]["median"] is None else f"{r['e2el_s']['median']:.2f}/{r['e2el_s']['p99']:.2f}",
                      f"{r['disconnected']}/{after['aborted']:.0f}",
                      "not idle" if not after["idle"] else f"{after['kv_cache_usage_perc']:.3f}")
    from courseware.terminal import make_console
    console = make_console()
    console.print(table)
    tokens_ok = True
    if args.compare_tokens:
        equal, compared = compare_tokens(report, json.loads(Path(args.compare_tokens).read_text()))
        tokens_ok = equal == compared
        console.print(f"token ids equal to {args.compare_tokens}'s: {equal}/{compared} requests")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(report, args.plot)
    clean = all(r["server_after"]["idle"] and r["server_after"]["kv_cache_usage_perc"] == 0 for r in report["runs"])
    return 0 if tokens_ok and clean and all(r["failed"] == 0 for r in report["runs"]) else 1
