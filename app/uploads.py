"""Stream a multipart corpus upload straight to disk: bounded size, hashed on the way.

Starlette's form parser would spool the whole body to a temporary file before the route could
refuse it; this parser stops at the first byte over the limit. The parser runs in a worker
thread, chunk by chunk, because its callbacks write the file: disk writes never block the event
loop. Only a body that reaches its closing boundary is a complete upload.

Before a byte of the file is written, its bytes are held of the key's storage quota (`reserve`):
at its first byte the most the body's Content-Length leaves for it, for a chunked body a
mebibyte at a time; an upload that would pass the quota stops there. Every corpus, uploaded or
inline (`write_corpus`), is written to a `.file_<id>.partial` file that is renamed into place
once checked, and a full disk gets the one 507 of `insufficient_storage`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

from .errors import ApiError
from .quotas import _size

_FIELD_LIMIT = 1024  # small text fields (text_field) only
MAX_FILENAME_CHARS = 255  # what every common file system allows a name; the files table's column too
# One part header line may be this long: python-multipart's default (4 KiB) would cut a long file
# name off as a "malformed body"; up to here we read it and name the limit it broke.
_HEADER_LIMIT = 32 * 1024
MULTIPART_OVERHEAD = 64 * 1024  # part headers and boundaries around a file of the largest allowed size
_HOW = "send the corpus as multipart/form-data with the file in a field named 'file' (curl -F file=@corpus.txt)"
RESERVE_STEP = 1024 * 1024  # a chunked body (no Content-Length) holds its quota a mebibyte at a time

# reserve(needed, wanted, what) -> bytes held: at least `needed` of the key's quota, up to `wanted`;
# raises ApiError 507 naming `what` ("the upload (2.0 MB)") if `needed` would pass the quota
Reserve = Callable[[int, int, str], int]


@dataclass
class ReceivedFile:
    filename: str
    path: Path
    bytes: int
    sha256: str
    fields: dict[str, str]


@dataclass
class _State:
    limit: int
    partial: Path
    header_field: bytes = b""
    header_value: bytes = b""
    headers: dict[bytes, bytes] = field(default_factory=dict)
    part_name: str | None = None
    field_buffer: bytearray = field(default_factory=bytearray)
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    handle: object | None = None
    written: int = 0
    hasher: "hashlib._Hash" = field(default_factory=hashlib.sha256)
    problem: ApiError | None = None
    complete: bool = False  # the closing boundary was seen
    reserve: Reserve | None = None
    reserved: int = 0  # bytes of the key's quota held for the file
    declared: int | None = None  # the body's Content-Length
    closing: int = 0  # length of the closing boundary, which follows the file's last byte
    fed: int = 0  # body bytes given to the parser before the chunk it is parsing
    failure: Exception | None = None  # a server error in a callback (the database), re-raised as such


def _callbacks(state: _State) -> dict:
    def on_part_begin() -> None:
        state.headers = {}
        state.part_name = None
        state.field_buffer = bytearray()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state.header_field += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state.header_value += data[start:end]

    def on_header_end() -> None:
        state.headers[state.header_field.lower()] = state.header_value
        state.header_field = state.header_value = b""

    def on_headers_finished() -> None:
        _disposition, options = parse_options_header(state.headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        state.part_name = name
        if name == "file":
            if state.handle is not None:
                state.problem = ApiError(422, "invalid_request", f"more than one 'file' part; {_HOW}", "file")
                return
            state.filename = options.get(b"filename", b"corpus.txt").decode("utf-8", "replace") or "corpus.txt"
            if len(state.filename) > MAX_FILENAME_CHARS:
                state.problem = _filename_too_long(len(state.filename))
                return
            state.handle = state.partial.open("wb")

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if state.problem is not None:
            return
        chunk = data[start:end]
        if state.part_name == "file" and state.handle is not None:
            state.written += len(chunk)
            if state.written > state.limit:
                state.problem = upload_too_large(f"more than {state.limit} bytes", state.limit)
                return
            if state.reserve is not None and state.written > state.reserved:
                _hold(state, start, len(chunk))
                if state.problem is not None or state.failure is not None:
                    return
            state.hasher.update(chunk)
            state.handle.write(chunk)
        else:
            state.field_buffer += chunk
            if len(state.field_buffer) > _FIELD_LIMIT:
                state.problem = ApiError(422, "invalid_request", f"form field {state.part_name!r} is too long; {_HOW}", state.part_name)

    def on_part_end() -> None:
        if state.part_name and state.part_name != "file" and state.problem is None:
            state.fields[state.part_name] = state.field_buffer.decode("utf-8", "replace")

    def on_end() -> None:
        state.complete = True

    return {
        "on_part_begin": on_part_begin,
        "on_header_field": on_header_field,
        "on_header_value": on_header_value,
        "on_header_end": on_header_end,
        "on_headers_finished": on_headers_finished,
        "on_part_data": on_part_data,
        "on_part_end": on_part_end,
        "on_end": on_end,
    }


def _hold(state: _State, start: int, length: int) -> None:
    """Hold quota for the file's bytes up to this chunk's last before writing them: with a known
    Content-Length, all the body can still hold of the file (so the check is made once, at the
    first byte, and an upload that cannot fit is refused before it is written); else a mebibyte
    ahead where it fits, at least this chunk. 507 (state.problem) if that would pass the quota."""
    if state.declared is not None:
        before = state.written - length  # file bytes before this chunk, which starts at body offset fed + start
        needed = wanted = min(max(before + state.declared - (state.fed + start) - state.closing, state.written), state.limit)
        what = f"the upload ({_size(needed)})"
    else:
        needed = state.written
        wanted = max(needed, min(state.reserved + RESERVE_STEP, state.limit))
        what = f"the upload (over {_size(needed)} so far)"
    try:
        state.reserved = state.reserve(needed, wanted, what)
    except ApiError as refused:
        state.problem = refused
    except Exception as exc:
        state.failure = exc


def insufficient_storage(param: str) -> ApiError:
    """The one answer to a full disk under a corpus, uploaded or inline."""
    return ApiError(
        507, "insufficient_storage",
        "the server ran out of disk space while storing the corpus; nothing was kept — "
        "try again later, and tell the operator if it persists",
        param,
    )


def disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def write_corpus(partial: Path, data: bytes, param: str) -> None:
    """Write a corpus given whole (inline corpus_text) to `partial`, as an upload is written:
    synced, removed again on any error, a full disk answered with `insufficient_storage`."""
    try:
        partial.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        partial.unlink(missing_ok=True)
        if disk_full(exc):
            raise insufficient_storage(param) from None
        raise  # any other disk error is the server's fault: logged, answered 500


async def receive_file(
    request: Request, partial: Path, limit: int, *, reserve: Reserve | None = None, max_seconds: float | None = None,
) -> ReceivedFile:
    """Write the 'file' part to `partial`, holding its bytes with `reserve` before writing them.
    Raises ApiError (408/413/415/422/507); removes `partial` on error (the caller lets go of what
    it reserved). An upload still arriving after `max_seconds` gets 408."""
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise ApiError(415, "unsupported_media_type", f"expected multipart/form-data; {_HOW}", "file")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + MULTIPART_OVERHEAD:
        raise upload_too_large(f"{declared} bytes", limit)
    state = _State(limit=limit, partial=partial, reserve=reserve)
    if declared and declared.isdigit():
        state.declared = int(declared)
        state.closing = len(b"\r\n--" + boundary + b"--\r\n")  # without its last CRLF a body holds 2 bytes more, found then
    parser = MultipartParser(boundary, _callbacks(state), max_header_size=_HEADER_LIMIT)
    started = time.monotonic()
    try:
        await run_in_threadpool(partial.parent.mkdir, parents=True, exist_ok=True)
        async for chunk in request.stream():
            if max_seconds is not None and time.monotonic() - started > max_seconds:
                raise ApiError(
                    408, "request_timeout",
                    f"the upload took longer than this server allows one upload, {max_seconds:g} s (TIDE_MAX_UPLOAD_S), "
                    f"after {state.fed} bytes; nothing was kept — send it over a faster connection, or split the corpus "
                    "into smaller files",
                    "file",
                )
            await run_in_threadpool(parser.write, chunk)
            state.fed += len(chunk)
            if state.failure is not None:
                raise state.failure
            if state.problem is not None:
                raise state.problem
        parser.finalize()
        if state.problem is not None:
            raise state.problem
        if state.handle is None:
            raise ApiError(422, "invalid_request", f"no 'file' part in the upload; {_HOW}", "file")
        if not state.complete:
            raise ApiError(
                422, "incomplete_upload",
                "the upload ended before the multipart body's closing boundary, so the file was cut short "
                f"and nothing was stored; send the whole body again ({_HOW})",
                "file",
            )
        await run_in_threadpool(_sync_and_close, state.handle)
    except ApiError:
        await run_in_threadpool(_discard, state)
        raise
    except OSError as exc:
        await run_in_threadpool(_discard, state)
        if disk_full(exc):
            raise insufficient_storage("file") from None
        raise  # any other disk error is the server's fault: logged, answered 500
    except Exception as exc:  # the multipart parser's own errors: a malformed body
        await run_in_threadpool(_discard, state)
        if exc is state.failure:
            raise  # the server's own (the database, while holding quota): logged, answered 500
        if "header size" in str(exc):
            raise ApiError(
                422, "invalid_request",
                f"a part header of the multipart body is longer than {_HEADER_LIMIT} bytes (with a file name of at most "
                f"{MAX_FILENAME_CHARS} characters it is far shorter); {_HOW}",
                "file",
            ) from None
        raise ApiError(422, "invalid_request", f"malformed multipart body ({type(exc).__name__}); {_HOW}", "file") from None
    return ReceivedFile(state.filename or "corpus.txt", partial, state.written, state.hasher.hexdigest(), state.fields)


def upload_too_large(size: str, limit: int) -> ApiError:
    """The one 413 of an upload, whoever notices (app.guard from the body's length, the parser from
    the file's): it quotes TIDE_MAX_UPLOAD_BYTES, the file's limit, never the body's (the file plus
    MULTIPART_OVERHEAD of multipart framing, which is ours to allow, not the client's to count)."""
    return ApiError(
        413, "file_too_large",
        f"the upload is {size}, over this server's limit of {limit} bytes for a corpus file (TIDE_MAX_UPLOAD_BYTES); "
        "split the corpus into smaller files, or ask the operator for a higher TIDE_MAX_UPLOAD_BYTES",
        "file",
    )


def _filename_too_long(length: int) -> ApiError:
    return ApiError(
        422, "filename_too_long",
        f"the upload's file name has {length} characters and the limit is {MAX_FILENAME_CHARS}: it is how GET /files "
        "shows the upload, so it is kept as given, never cut; rename the file, or send a shorter name "
        "(curl -F 'file=@corpus.txt;filename=corpus.txt'); a .jsonl or .ndjson ending makes it a JSONL corpus",
        "file",
    )


def _sync_and_close(handle) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


def _discard(state: _State) -> None:
    if state.handle is not None:
        try:
            state.handle.close()
        except OSError:
            pass  # closing flushes what is buffered, which fails again on a full disk
    state.partial.unlink(missing_ok=True)
