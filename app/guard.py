"""Request bodies are bounded before the app reads them.

A request that carries a body must show a valid API key first (a bearer key, or a signed-in
browser's live session cookie; its CSRF token is checked by the route, since a form may carry it in the body): an anonymous client gets its 401 before one byte of
its body is read. The one exception is the sign-in form, whose body IS the key: it is capped at
LOGIN_BODY_BYTES instead. Then the body is capped (TIDE_MAX_REQUEST_BODY_BYTES;
corpus uploads TIDE_MAX_UPLOAD_BYTES) and every wait for its next piece is bounded
(TIDE_REQUEST_BODY_TIMEOUT_S). Bytes are counted as they stream in, so a chunked body without a
Content-Length is capped too, and nothing is buffered here. Refusals are answered in the one
error shape with `Connection: close`, so the server stops reading the rest of the body and the
connection is freed.

Pure ASGI rather than Starlette's BaseHTTPMiddleware: that one would hand the app a copy of the
receive channel that cannot be cut off mid-body.
"""

from __future__ import annotations

import anyio
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .db.browser_sessions import COOKIE_NAME
from .deps import browser_key, key_for_token
from .errors import ApiError, error_response
from .settings import Settings
from .uploads import MULTIPART_OVERHEAD, upload_too_large

UPLOAD_PATH = "/files"
LOGIN_PATH = "/ui/login"
LOGIN_BODY_BYTES = 4096  # a form with an API key and a page to return to


class _BodyRefused(Exception):
    """Raised into the app's body reading once the guard has decided to refuse the request."""


def _has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    return (length is not None and length.strip() != "0") or "chunked" in headers.get("transfer-encoding", "").lower()


class RequestGuard:
    def __init__(self, app: ASGIApp, settings: Settings, sessions: sessionmaker[Session]):
        self.app = app
        self.settings = settings
        self.sessions = sessions

    def _limit(self, scope: Scope) -> tuple[int, str, str]:
        """(bytes, setting name, what the body is) for this request."""
        if scope["path"].rstrip("/") == UPLOAD_PATH:
            return self.settings.max_upload_bytes + MULTIPART_OVERHEAD, "TIDE_MAX_UPLOAD_BYTES", "upload"
        if scope["path"].rstrip("/") == LOGIN_PATH:
            return LOGIN_BODY_BYTES, "the sign-in form's limit", "sign-in form"
        return self.settings.max_request_body_bytes, "TIDE_MAX_REQUEST_BODY_BYTES", "request body"

    def _too_large(self, scope: Scope, declared: str | None) -> ApiError:
        """`declared`: the Content-Length over the limit; None: a streamed body that passed it."""
        limit, setting, what = self._limit(scope)
        if what == "upload":
            # The body may exceed the file's limit by the multipart framing, so a body past its own
            # limit holds a file past TIDE_MAX_UPLOAD_BYTES: that is the one number a client sees.
            file_limit = self.settings.max_upload_bytes
            return upload_too_large(f"{declared} bytes" if declared else f"more than {file_limit} bytes", file_limit)
        size = declared or f"more than {limit}"
        hint = "upload big corpora with POST /files and pass corpus_file_id"
        return ApiError(
            413, "payload_too_large", f"the {what} is {size} bytes, over this server's limit of {limit} bytes ({setting}); {hint}", "body",
        )

    def _bearer_key(self, headers: Headers):
        """The caller's bearer key; for a signed-in browser only a check that its session is live
        (None), since its CSRF token may travel in the body (the pages' forms): the route checks it
        after reading (app.deps.current_key, the page routes)."""
        scheme, token = get_authorization_scheme_param(headers.get("authorization"))
        bearer = token if scheme.lower() == "bearer" else None
        cookies = cookie_parser(headers.get("cookie", ""))
        if not bearer and COOKIE_NAME in cookies:
            browser_key(self.sessions, cookies[COOKIE_NAME], "GET", None)
            return None
        return key_for_token(self.sessions, bearer)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        if not _has_body(headers):
            return await self.app(scope, receive, send)

        if scope["path"].rstrip("/") != LOGIN_PATH:
            try:
                key = await run_in_threadpool(self._bearer_key, headers)
            except ApiError as refusal:
                return await _refuse(refusal, scope, send)
            if key is not None:
                scope.setdefault("state", {})["api_key"] = key

        limit, _setting, _what = self._limit(scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return await _refuse(self._too_large(scope, declared), scope, send)

        await _Guarded(self, scope, receive, send, limit).run()


class _Guarded:
    """One request's body under watch: counted, timed, and its answer replaced on refusal."""

    def __init__(self, guard: RequestGuard, scope: Scope, receive: Receive, send: Send, limit: int):
        self.guard, self.scope, self._receive, self._send, self.limit = guard, scope, receive, send, limit
        self.received = 0
        self.body_done = False
        self.refusal: ApiError | None = None
        self.response_started = False

    async def receive(self) -> Message:
        if self.refusal is not None:
            raise _BodyRefused()
        if self.body_done:  # the app only listens for a disconnect now: no limit on waiting
            return await self._receive()
        timeout = self.guard.settings.request_body_timeout_s
        with anyio.move_on_after(timeout) as waited:
            message = await self._receive()
        if waited.cancelled_caught:
            self.refusal = ApiError(
                408, "request_timeout",
                f"the request body stopped arriving: nothing came for {timeout:g} s after {self.received} bytes "
                "(TIDE_REQUEST_BODY_TIMEOUT_S); send the whole body without pausing, then retry",
                "body",
            )
            raise _BodyRefused()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.refusal = self.guard._too_large(self.scope, None)
                raise _BodyRefused()
            if not message.get("more_body", False):
                self.body_done = True
        return message

    async def send(self, message: Message) -> None:
        if self.refusal is not None:
            return  # the app's own answer to the cut-off body; ours replaces it
        if message["type"] == "http.response.start":
            self.response_started = True
        await self._send(message)

    async def run(self) -> None:
        try:
            await self.guard.app(self.scope, self.receive, self.send)
        except _BodyRefused:
            pass
        except Exception:
            if self.refusal is None:
                raise
        if self.refusal is not None and not self.response_started:
            await _refuse(self.refusal, self.scope, self._send)


async def _refuse(refusal: ApiError, scope: Scope, send: Send) -> None:
    headers = {**(refusal.headers or {}), "Connection": "close"}
    response = error_response(refusal.status, refusal.code, refusal.message, refusal.param, headers)

    async def nothing_more() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, nothing_more, send)
