"""Every error the server sends is an OpenAI error body, and none of them closes the connection.

OpenAI's body is `{"error": {"message", "type", "param", "code"}}`. Three
kinds of error reach a client: ours (`RequestError`, raised wherever a request
is refused), Starlette's own (404 for an unknown path, 405 for a wrong method),
and a bug. The first two get handlers here.
A bug is turned into a 500 inside the route (`openai_errors`), because an
exception that escapes the route reaches Starlette's ServerErrorMiddleware,
which answers and then re-raises it so that uvicorn logs it, and uvicorn then
closes the connection: the client's next request on it would be reset. The
price: the traceback goes to this server's log through `logging`, not
through uvicorn's handler.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

logger = logging.getLogger(__name__)


class RequestError(Exception):
    """A refused request: becomes an OpenAI error body with this status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, err_type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.err_type = status, param, code, err_type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.err_type, "param": self.param, "code": self.code}}


def install_handlers(app: FastAPI, retry_after_s: int) -> None:
    """OpenAI bodies for RequestError and for Starlette's HTTP errors (404, 405)."""

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, err: RequestError) -> JSONResponse:
        headers = {"Retry-After": str(retry_after_s)} if err.status == 503 else None
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
        message = f"{err.detail}: {request.method} {request.url.path}"
        err_type = "server_error" if err.status_code >= 500 else "invalid_request_error"
        body = RequestError(message, status=err.status_code, err_type=err_type).body()
        return JSONResponse(body, status_code=err.status_code, headers=err.headers)


def openai_errors(route: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a route so that an unexpected exception becomes a logged 500 OpenAI body (see the module docstring)."""

    @functools.wraps(route)
    async def guarded(request: Request) -> Response:
        try:
            return await route(request)
        except (RequestError, HTTPException):
            raise
        except Exception:
            logger.exception("unexpected error serving %s %s", request.method, request.url.path)
            raise RequestError("internal server error (the server's log has the details)", status=500,
                               err_type="server_error") from None
    return guarded
