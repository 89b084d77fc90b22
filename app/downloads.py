"""Downloads: one file of a published model, or the whole-model archive produced from the model
folder as it is sent. Starlette's FileResponse does Range, multiple ranges, If-Range, HEAD and
the 416 answer; these subclasses give it files opened while the answer is made.

A download opens every file it will send before it answers, so the files a DELETE or the expiry
sweep unlinks while it is being sent stay readable through the open handles until the last byte
is out (their disk space comes back when the download ends): a client gets every byte the 200 or
206 announced, never a response cut short. A file already gone when the download starts raises
OSError in the constructor, before any header is sent, so the route can answer 404 or 410.
"""

from __future__ import annotations

import os
import stat
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO

import anyio
from starlette.datastructures import Headers
from starlette.responses import FileResponse
from starlette.types import Receive, Scope, Send

from .ranges import RangeRules
from .storage import ArchiveLayout, ArchiveReader


class _AsyncReader:
    """The two calls FileResponse makes on its open file, reads run in a worker thread (disk)."""

    def __init__(self, reader: BinaryIO | ArchiveReader):
        self.reader = reader

    async def seek(self, position: int) -> int:
        return self.reader.seek(position)

    async def read(self, size: int) -> bytes:
        return await anyio.to_thread.run_sync(self.reader.read, size)


class OpenedDownload(RangeRules, FileResponse):
    """A FileResponse that sends from a reader opened beforehand, with the API's Range rules."""

    def __init__(self, reader: BinaryIO | ArchiveReader, stat_result: os.stat_result, *, filename: str, media_type: str,
                 headers: dict[str, str] | None = None):
        self.reader = reader
        super().__init__(filename, filename=filename, media_type=media_type, stat_result=stat_result, headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A server offering "pathsend" would be handed self.path to open itself: not the open file.
        extensions = {name: value for name, value in scope.get("extensions", {}).items() if name != "http.response.pathsend"}
        try:
            if none_match(Headers(scope=scope).get("if-none-match"), self.headers.get("etag")):
                await self._not_modified(send)
            else:
                await super().__call__({**scope, "extensions": extensions}, receive, send)
        finally:
            self.reader.close()  # also after HEAD, a 304, a 416 or a client that went away

    async def _not_modified(self, send: Send) -> None:
        """304: the client's copy is this very file (RFC 9110 section 15.4.5: the validators, no body)."""
        kept = [(name, value) for name, value in self.raw_headers if name in _NOT_MODIFIED_HEADERS]
        await send({"type": "http.response.start", "status": 304, "headers": kept})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @asynccontextmanager
    async def _open_file(self):
        yield _AsyncReader(self.reader)


_NOT_MODIFIED_HEADERS = frozenset({b"etag", b"last-modified", b"cache-control", b"content-location", b"vary", b"expires"})


def none_match(if_none_match: str | None, etag: str | None) -> bool:
    """Whether If-None-Match names this ETag (or is "*"): weak comparison, as RFC 9110 section
    13.1.2 asks for GET and HEAD. It is evaluated before Range (section 13.2.2)."""
    if not if_none_match or not etag:
        return False
    if if_none_match.strip() == "*":
        return True
    ours = etag.removeprefix("W/")
    return any(tag.strip().removeprefix("W/") == ours for tag in if_none_match.split(","))


class Download(OpenedDownload):
    """A file from disk, opened now."""

    def __init__(self, path: Path, *, filename: str, media_type: str):
        handle = path.open("rb")
        super().__init__(handle, os.fstat(handle.fileno()), filename=filename, media_type=media_type)


class ArchiveResponse(OpenedDownload):
    def __init__(self, layout: ArchiveLayout, *, filename: str, sha256: str, mtime: int):
        # Size and mtime give Content-Length and Last-Modified; the sha256 is the strong ETag, so
        # If-Range (curl -C -) resumes only the very same bytes.
        stat_result = os.stat_result((stat.S_IFREG | 0o644, 0, 0, 1, 0, 0, layout.size, mtime, mtime, mtime))
        super().__init__(layout.open(), stat_result, filename=filename, media_type="application/x-tar",
                         headers={"etag": f'"{sha256}"'})
