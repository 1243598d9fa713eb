# Generated from reference/serving/api_server.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""An OpenAI-compatible HTTP server over the reference engine (FastAPI + uvicorn).

    inferlab serve MODEL_DIR --port 8000

The lifecycle on this path: the handler stamps ARRIVED the moment the request
is received (so TTFT includes the API's share) and reads the body (at most
--max-request-bytes); a worker thread parses, checks and tokenizes it
(stage 1-2, preprocess.py) and the engine thread runs it (`EngineLoop`,
stages 3-5). Each step's tokens are detokenized in their own thread and sent
as Server-Sent Events or gathered into one body (stage 6). A client that
disconnects, streaming or not, aborts its request, and its blocks are freed
at the next step boundary.

Shutdown (SIGINT, SIGTERM): uvicorn stops accepting connections; the engine
admits nothing more and lets running requests go on for --drain-timeout
seconds, then aborts the rest, so every stream still ends with a last chunk
(finish_reason "abort") and `data: [DONE]`.
"""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

from student_exercises.detokenizer import IncrementalDetokenizer
from student_exercises.engine.llm_engine import LLMEngine
from student_exercises.llm import default_parts
from student_exercises.serving import defaults
from student_exercises.serving.engine_loop import EngineLoop, QueueFull, RequestStream
from student_exercises.serving.errors import RequestError, install_handlers, openai_errors
from student_exercises.serving.output_processor import Delta, OutputProcessor
from student_exercises.serving.preprocess import Prepared, Preprocessor
from student_exercises.serving.prometheus import EngineMetrics
from student_exercises.serving.responses import ResponseBuilder

logger = logging.getLogger(__name__)

EVENTS_KEPT_IN_MEMORY = 10_000   # the log file keeps every event; memory keeps the newest
# uvicorn cancels what is left this long after the drain deadline: time for the last chunks to go out.
SHUTDOWN_MARGIN_S = 5.0


def check_kv_pool(engine: LLMEngine) -> None:
    """Refuse a KV pool that cannot hold one request of max_model_len tokens.

    A server defaults a chat request's max_tokens to the rest of the context,
    so with such a pool every request without max_tokens would be refused.
    We refuse at startup, as vLLM does, rather than derive a smaller default,
    so the numbers to change are in front of whoever starts the server.
    """
    max_len, pool = engine.config.max_model_len, engine.num_kvcache_blocks
    needed = engine.blocks_for(max_len)
    if needed > pool:
        block = engine.config.kvcache_block_size
        raise ValueError(f"the KV pool holds {pool} blocks of {block} tokens ({pool * block} tokens), but one request "
                         f"of max_model_len={max_len} tokens needs {needed} blocks: lower --max-model-len to at most "
                         f"{pool * block} or raise --num-kvcache-blocks to at least {needed}")


def build_app(engine: LLMEngine, model_name: str, max_waiting: int = defaults.MAX_WAITING_REQUESTS,
              retry_after_s: int = 1, max_request_bytes: int = defaults.MAX_REQUEST_BYTES) -> FastAPI:
    """The FastAPI app serving `engine` under `model_name`; its threads start with the app."""
    check_kv_pool(engine)
    outputs = OutputProcessor(engine.tokenizer)
    loop = EngineLoop(engine, max_waiting, sink=outputs.put)
    preprocessor = Preprocessor(engine, model_name)
    metrics = EngineMetrics(model_name, engine.config.max_model_len, running=lambda: engine.num_running,
                            waiting=loop.num_waiting, kv_usage=lambda: engine.kv_cache_usage)
    engine.log.keep_last(EVENTS_KEPT_IN_MEMORY)
    engine.log.subscribe(metrics.on_event)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        outputs.start()
        loop.start()
        yield
        loop.shutdown()
        outputs.shutdown()
        preprocessor.shutdown()
        engine.log.flush()

    app = FastAPI(title="InferLab", lifespan=lifespan)
    app.state.engine_loop = loop
    install_handlers(app, retry_after_s)

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine runs and takes requests; 503 once it stopped or is draining."""
        return Response(status_code=200 if loop.alive and not loop.draining else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "inferlab", "max_model_len": engine.config.max_model_len}]}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def handle(request: Request, chat: bool) -> Response:
        arrival = engine.log.now()          # ARRIVED: when the HTTP request reached us
        prepared = await preprocessor.prepare(await read_body(request, max_request_bytes), chat)
        try:
            stream = loop.submit(prepared.token_ids, prepared.params, arrival,
                                 IncrementalDetokenizer(engine.tokenizer))
        except QueueFull as err:
            raise RequestError(f"server busy: {err}; retry later", status=503, err_type="server_busy") from None
        kind = "chatcmpl" if chat else "cmpl"
        ids = {"id": f"{kind}-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_name}
        builder = ResponseBuilder(chat, ids, prepared.params.logprobs, stream.prompt_len)
        if prepared.request.stream:
            return AbortingStream(_sse(loop, stream, builder, prepared), lambda: _abort_unless_done(loop, stream))
        return await _complete(request, loop, stream, builder, prepared)

    @app.post("/v1/completions")
    @openai_errors
    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    @openai_errors
    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    return app


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit` bytes.

    Not Starlette's RequestBodyLimitMiddleware: when the declared
    Content-Length is over its limit it replaces whatever response the app
    sends with its own plain-text 413, and every error here is an OpenAI body.
    A body without Content-Length (chunked) is counted as it arrives.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:   # nobody to answer: an error body only so that nothing is logged as a bug
        raise RequestError("the client went away while sending the request body") from None
    return b"".join(chunks)


def _too_large(limit: int) -> RequestError:
    return RequestError(f"the request body is larger than {limit} bytes, the most this server accepts "
                        "(--max-request-bytes)", status=413)


def _abort_unless_done(loop: EngineLoop, stream: RequestStream) -> None:
    if not stream.done:
        loop.abort(stream)


class AbortingStream(StreamingResponse):
    """An SSE response that aborts its request however the response ends before the request did.

    Starlette cancels a StreamingResponse whose client disconnects; if that
    happens before the body generator first ran, the generator never sees
    the cancellation, so the abort is here, around the whole response.
    """

    def __init__(self, content: AsyncIterator[str], on_end) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._on_end = on_end

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_end()


async def _complete(request: Request, loop: EngineLoop, stream: RequestStream, builder: ResponseBuilder,
                    prepared: Prepared) -> Response:
    """A non-streaming response: every Delta gathered, while a watcher aborts the request if the client leaves."""
    watcher = asyncio.create_task(_abort_on_disconnect(request, loop, stream))
    try:
        deltas = await _all_deltas(stream)
    finally:
        watcher.cancel()
        _abort_unless_done(loop, stream)   # cancelled (uvicorn gave up on the connection)
    last = deltas[-1]
    if last.finish_reason == "error":
        raise RequestError(f"the engine failed while running this request: {last.error}", status=500,
                           err_type="server_error")
    text = prepared.echo + "".join(d.text for d in deltas)
    token_ids = [t for d in deltas for t in d.token_ids]
    logprobs = [e for d in deltas for e in d.logprobs or []]
    return JSONResponse(builder.full(text, token_ids, logprobs, last.finish_reason))


async def _all_deltas(stream: RequestStream) -> list[Delta]:
    deltas = []
    while not stream.done:
        deltas.append(await _next_delta(stream))
    return deltas


async def _next_delta(stream: RequestStream) -> Delta:
    delta = await stream.outputs.get()
    stream.done = delta.finished
    return delta


async def _abort_on_disconnect(request: Request, loop: EngineLoop, stream: RequestStream) -> None:
    """Wait for the client to go away (the body is read, so the next ASGI message is the disconnect), then abort.

    A streaming response needs no watcher: Starlette's StreamingResponse
    listens for the disconnect itself and cancels the response, which aborts
    (`AbortingStream`).
    """
    while (await request.receive())["type"] != "http.disconnect":
        pass
    loop.abort(stream)


async def _sse(loop: EngineLoop, stream: RequestStream, builder: ResponseBuilder,
               prepared: Prepared) -> AsyncIterator[str]:
    """OpenAI's chunk format as Server-Sent Events, one chunk per step's tokens, then [DONE].

    Whatever happens, the stream ends with [DONE]: an engine failure becomes
    a last chunk with `error`; a bug is logged and ends the stream the same
    way, rather than escaping into Starlette and closing the connection. (A
    client gone mid-stream cancels it: `AbortingStream` aborts the request.)
    """
    num_tokens, first, echo = 0, True, prepared.echo
    try:
        while True:
            delta = await _next_delta(stream)
            num_tokens += len(delta.token_ids)
            reason = delta.finish_reason if delta.finished else None
            chunk = builder.chunk(echo + delta.text, delta.token_ids, delta.logprobs, reason, first)
            first, echo = False, ""
            if reason == "error":
                chunk["error"] = {"message": f"the engine failed while running this request: {delta.error}",
                                  "type": "server_error"}
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
            if delta.finished:
                break
        if prepared.request.include_usage:
            yield f"data: {json.dumps(builder.usage_chunk(num_tokens))}\n\n"
    except Exception:
        logger.exception("streaming a response failed")
        loop.abort(stream)
        yield f"data: {json.dumps({'error': {'message': 'internal server error', 'type': 'server_error'}})}\n\n"
    yield "data: [DONE]\n\n"


class DrainingServer(uvicorn.Server):
    """uvicorn's Server, with the engine told to drain the moment shutdown begins.

    uvicorn stops accepting and waits for open connections up to its
    `timeout_graceful_shutdown`, then cancels them: a stream cut that way gets
    no last chunk and logs a CancelledError. So shutdown first starts the
    engine's drain, whose deadline comes before uvicorn's: streams end
    themselves, cleanly, and uvicorn never has to cancel one.
    """

    def __init__(self, app: FastAPI, host: str, port: int, drain_timeout: float):
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                        timeout_graceful_shutdown=drain_timeout + SHUTDOWN_MARGIN_S))
        self.engine_loop: EngineLoop = app.state.engine_loop
        self.drain_timeout = drain_timeout

    async def shutdown(self, sockets=None) -> None:
        self.engine_loop.drain(self.drain_timeout)
        await super().shutdown(sockets)


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          max_waiting: int = defaults.MAX_WAITING_REQUESTS, max_request_bytes: int = defaults.MAX_REQUEST_BYTES,
          drain_timeout: float = defaults.DRAIN_TIMEOUT_S, **engine_config) -> None:
    """Load the model, then serve it until SIGINT/SIGTERM (then drain, see the module docstring).

    The process's main function: when it returns, the process ends.
    """
    engine = LLMEngine(model_dir, default_parts(engine_config.get("tensor_parallel_size", 1)), **engine_config)
    name = model_name or model_dir.rstrip("/").rsplit("/", 1)[-1]
    app = build_app(engine, name, max_waiting=max_waiting, max_request_bytes=max_request_bytes)
    try:
        DrainingServer(app, host, port, drain_timeout).run()
    except KeyboardInterrupt:
        pass   # uvicorn raises the SIGINT it stopped for again, once it has shut down cleanly: not an error
    finally:
        close = getattr(engine.model_runner, "close", None)   # tensor parallelism: stop the worker processes now
        if close is not None:
            close()
    # Everything alive now dies with the process. Frozen, it is skipped by the full collections the
    # interpreter runs while exiting, which walk every object (torch, transformers): that walk took
    # seconds on a busy 2-core machine (docs/serving.md, "Shutdown").
    gc.freeze()
