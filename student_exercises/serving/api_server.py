# Generated from reference/serving/api_server.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""An OpenAI-compatible HTTP server over the reference engine (FastAPI + uvicorn).

    inferlab serve MODEL_DIR --port 8000

The lifecycle on this path: the handler stamps ARRIVED the moment the request
is received (so TTFT includes the API's share), parses and checks the body and
tokenizes it (stage 1-2), and hands it to the engine thread (`EngineLoop`,
stages 3-5). Tokens come back per step and are detokenized incrementally and
sent as Server-Sent Events (stage 6). A client that disconnects aborts its
request, and its blocks are freed at the next step boundary.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from student_exercises.detokenizer import IncrementalDetokenizer
from student_exercises.engine.llm_engine import LLMEngine, StepOutput
from student_exercises.llm import default_parts
from student_exercises.serving.engine_loop import EngineLoop, QueueFull, RequestStream
from student_exercises.serving.prometheus import EngineMetrics
from student_exercises.serving.protocol import ChatCompletionRequest, CompletionRequest, RequestError, parse

DISCONNECT_POLL_S = 0.25
EVENTS_KEPT_IN_MEMORY = 10_000   # the log file keeps every event; memory keeps the newest


def build_app(engine: LLMEngine, model_name: str, max_waiting: int = 256, retry_after_s: int = 1) -> FastAPI:
    """The FastAPI app serving `engine` under `model_name`; the engine thread starts with the app."""
    loop = EngineLoop(engine, max_waiting)
    blocks = engine.block_manager
    metrics = EngineMetrics(model_name, running=lambda: engine.num_running, waiting=loop.num_waiting,
                            kv_usage=lambda: blocks.num_used_blocks / len(blocks.blocks))
    engine.log.keep_last(EVENTS_KEPT_IN_MEMORY)
    engine.log.subscribe(metrics.on_event)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop.start()
        yield
        loop.shutdown()
        engine.log.flush()

    app = FastAPI(title="InferLab", lifespan=lifespan)
    app.state.engine_loop = loop

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, err: RequestError) -> JSONResponse:
        headers = {"Retry-After": str(retry_after_s)} if err.status == 503 else None
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if loop.alive else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "inferlab", "max_model_len": engine.config.max_model_len}]}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def admit(request: Request, body_type: type) -> tuple[Any, RequestStream]:
        arrival = engine.log.now()          # ARRIVED: when the HTTP request reached us
        try:
            raw = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError("the request body is not valid JSON") from None
        body = parse(body_type, raw)
        if body.model != model_name:
            raise RequestError(f"the model `{body.model}` does not exist; this server serves `{model_name}`",
                               param="model", code="model_not_found")
        prompt = body.prompt if isinstance(body, CompletionRequest) else _chat_prompt(engine, body)
        try:
            token_ids = engine.tokenize(prompt)
            params = body.sampling_params(default_max_tokens=max(1, engine.config.max_model_len - len(token_ids)))
            engine.check_request(token_ids, params)
        except (ValueError, TypeError) as err:
            raise RequestError(str(err)) from None
        try:
            return body, loop.submit(token_ids, params, arrival)
        except QueueFull as err:
            raise RequestError(f"server busy: {err}; retry later", status=503, err_type="server_busy") from None

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body, stream = await admit(request, CompletionRequest)
        return await _respond(request, body, stream, engine, model_name, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body, stream = await admit(request, ChatCompletionRequest)
        return await _respond(request, body, stream, engine, model_name, chat=True)

    return app


def _chat_prompt(engine: LLMEngine, body: ChatCompletionRequest) -> str:
    """The chat template, applied on the server (the model folder's own template)."""
    messages = [m.model_dump() for m in body.messages]
    try:
        return engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as err:   # a template that rejects these messages
        raise RequestError(f"messages: the chat template failed: {err}", param="messages") from None


async def _respond(request: Request, body, stream: RequestStream, engine: LLMEngine, model_name: str,
                   chat: bool) -> Response:
    kind = "chatcmpl" if chat else "cmpl"
    ids = {"id": f"{kind}-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_name}
    if body.stream:
        events = _sse(request, stream, engine, ids, chat, body.include_usage)
        return StreamingResponse(events, media_type="text/event-stream")
    outputs = [out async for out in _outputs(request, stream)]
    token_ids = [t for out in outputs for t in out.new_token_ids]
    reason = outputs[-1].finish_reason if outputs else "abort"
    if reason == "error":
        raise RequestError("the engine failed while running this request", status=500, err_type="server_error")
    text = engine.tokenizer.decode(token_ids, skip_special_tokens=True)
    usage = _usage(stream, len(token_ids))
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
        return JSONResponse({**ids, "object": "chat.completion", "choices": [choice], "usage": usage})
    choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None, "token_ids": token_ids}
    return JSONResponse({**ids, "object": "text_completion", "choices": [choice], "usage": usage})


async def _outputs(request: Request, stream: RequestStream) -> AsyncIterator[StepOutput]:
    """A request's outputs until it finishes; a disconnected client aborts it."""
    loop = request.app.state.engine_loop
    try:
        while True:
            try:
                out = await asyncio.wait_for(stream.outputs.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    loop.abort(stream)
                    return
                continue
            yield out
            if out.finished:
                return
    except asyncio.CancelledError:   # the response task was cancelled: the client went away
        loop.abort(stream)
        raise


async def _sse(request: Request, stream: RequestStream, engine: LLMEngine, ids: dict, chat: bool,
               include_usage: bool) -> AsyncIterator[str]:
    """OpenAI's chunk format as Server-Sent Events, one chunk per step's tokens, then [DONE]."""
    detokenizer = IncrementalDetokenizer(engine.tokenizer)
    num_tokens, first = 0, True
    async for out in _outputs(request, stream):
        num_tokens += len(out.new_token_ids)
        delta = detokenizer.push(out.new_token_ids, out.finished)
        reason = out.finish_reason if out.finished else None
        if chat:
            message = {"role": "assistant", "content": delta} if first else {"content": delta}
            choice = {"index": 0, "delta": message, "finish_reason": reason}
            chunk = {**ids, "object": "chat.completion.chunk", "choices": [choice]}
        else:
            choice = {"index": 0, "text": delta, "finish_reason": reason, "logprobs": None,
                      "token_ids": out.new_token_ids}
            chunk = {**ids, "object": "text_completion", "choices": [choice]}
        first = False
        if reason == "error":
            chunk["error"] = {"message": "the engine failed while running this request", "type": "server_error"}
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    if include_usage:
        usage_chunk = {**ids, "object": "chat.completion.chunk" if chat else "text_completion", "choices": [],
                       "usage": _usage(stream, num_tokens)}
        yield f"data: {json.dumps(usage_chunk)}\n\n"
    yield "data: [DONE]\n\n"


def _usage(stream: RequestStream, completion_tokens: int) -> dict[str, int]:
    prompt_tokens = stream.prompt_len
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          max_waiting: int = 256, **engine_config) -> None:
    """Load the model, then serve it until SIGINT/SIGTERM (uvicorn's graceful shutdown stops the engine)."""
    import uvicorn

    engine = LLMEngine(model_dir, default_parts(engine_config.get("tensor_parallel_size", 1)), **engine_config)
    name = model_name or model_dir.rstrip("/").rsplit("/", 1)[-1]
    app = build_app(engine, name, max_waiting=max_waiting)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        close = getattr(engine.model_runner, "close", None)   # tensor parallelism: stop the worker processes now
        if close is not None:
            close()
