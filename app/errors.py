"""One error shape for every failure: {"error": {"code", "message", "param"}}.

FastAPI's own answers (validation, unknown route, wrong method) are rewritten into it, and
nothing unexpected ever leaks a stack trace to the client.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from extension.errors import TideError
from extension.plan.options import by_api_path

log = logging.getLogger("tide.api")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers


# An error message quotes what the client sent so it can see what was wrong, but never all of an
# unbounded input (a 100 KB job id gave a 100 KB 404 body): quoted values are cut to QUOTE_CHARS,
# and as a last guard any message to MAX_MESSAGE_CHARS, any param to MAX_PARAM_CHARS.
QUOTE_CHARS = 64
MAX_MESSAGE_CHARS = 2000
MAX_PARAM_CHARS = 200


def quoted(value: str, limit: int = QUOTE_CHARS) -> str:
    """A client's value for an error message, as repr(); cut to `limit` characters, with its length."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value):,} characters)"


def _cut(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}... (cut; {len(text):,} characters)"


def error_response(status: int, code: str, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"code": code, "message": _cut(message, MAX_MESSAGE_CHARS), "param": _cut(param, MAX_PARAM_CHARS)}
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        where = parts.pop(0)
        if not parts:
            return "body" if where == "body" else None
    name = ""
    for part in parts:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += ("." if name else "") + str(part)
    return name or None


_JSON_TYPES = {
    "NoneType": "null",
    "list": "an array",
    "str": "a string",
    "int": "a number",
    "float": "a number",
    "bool": "true/false",
    "bytes": "a body that is not JSON (send Content-Type: application/json)",
}


def _validation_message(error: dict[str, Any], param: str | None) -> tuple[str, str]:
    kind = error.get("type", "")
    where = param or "request"
    if kind == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "syntax error")
        offset = error.get("loc", (None, None))[-1]
        at = f" at character {offset}" if isinstance(offset, int) else ""
        return "malformed_json", (
            f"the request body is not valid JSON ({detail}{at}); send one JSON object with "
            "Content-Type: application/json"
        )
    if kind == "missing" and where == "body":
        return "invalid_request", "the request needs a JSON body; send one JSON object with Content-Type: application/json"
    if kind == "missing":
        return "invalid_request", f"{where} is required; add it to the request"
    if kind == "extra_forbidden":
        return "invalid_request", f"{where} is not a known field; remove it or check its spelling against /docs"
    option = by_api_path(param or "")
    if option is not None and "input" in error and option.problem(error["input"]) is not None:
        # an option out of its range or of the wrong type: the same words the CLI and library use
        return "invalid_option", f"{param} {option.problem(error['input'])}"
    if kind == "model_attributes_type" or kind == "dict_type":
        got = _JSON_TYPES.get(type(error.get("input")).__name__, "another type")
        return "invalid_request", f"{where} must be a JSON object; got {got}"
    return "invalid_request", f"{where}: {error.get('msg', 'invalid value')}; fix the value (see /docs for the allowed range)"


async def _validation_handler(_request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = tuple(first.get("loc", ()))
    # a JSON syntax error's location is ("body", character offset): the body is what to fix
    param = "body" if first.get("type") == "json_invalid" else _param_from_loc(loc)
    code, message = _validation_message(first, param)
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return error_response(422, code, message, param)


_HTTP_CODES = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    410: "gone",
    413: "payload_too_large",
    415: "unsupported_media_type",
    416: "range_not_satisfiable",
}


async def _http_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400:
        # FastAPI's only 400: a body it could not even decode (e.g. not UTF-8). Same answer as
        # any other malformed JSON.
        return error_response(
            422, "malformed_json",
            "the request body could not be read as JSON (is it UTF-8?); send one JSON object with Content-Type: application/json",
            "body",
        )
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    if exc.status_code == 404:
        message = f"no route {quoted(request.url.path, 200)}; see /docs for the API"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {quoted(request.url.path, 200)}; see /docs for the methods it takes"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, code, message, None, getattr(exc, "headers", None))


async def _api_handler(_request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.code, exc.message, exc.param, exc.headers)


async def _tide_handler(_request: Request, exc: TideError) -> JSONResponse:
    return error_response(422, exc.code, exc.message, exc.param)


async def _unexpected_handler(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "internal_error", "the server hit an unexpected error; it has been logged — retry, and report it if it persists")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(ApiError, _api_handler)
    app.add_exception_handler(TideError, _tide_handler)
    app.add_exception_handler(Exception, _unexpected_handler)
