"""The whole-model archive over HTTP, produced from the model folder as it is sent.

Starlette's FileResponse does Range, multiple ranges, If-Range and the 416 answer; this
subclass only gives it an ArchiveLayout to read from instead of a file on disk.
"""

from __future__ import annotations

import os
import stat
from contextlib import asynccontextmanager

import anyio
from starlette.responses import FileResponse
from starlette.types import Receive, Scope, Send

from .ranges import RangeRules
from .storage import ArchiveLayout, ArchiveReader


class _AsyncArchiveReader:
    """The two calls FileResponse makes on its open file, run in a worker thread (disk reads)."""

    def __init__(self, reader: ArchiveReader):
        self.reader = reader

    async def seek(self, position: int) -> int:
        return self.reader.seek(position)

    async def read(self, size: int) -> bytes:
        return await anyio.to_thread.run_sync(self.reader.read, size)


class ArchiveResponse(RangeRules, FileResponse):
    def __init__(self, layout: ArchiveLayout, *, filename: str, sha256: str, mtime: int):
        # Size and mtime give Content-Length and Last-Modified; the sha256 is the strong ETag, so
        # If-Range (curl -C -) resumes only the very same bytes.
        stat_result = os.stat_result((stat.S_IFREG | 0o644, 0, 0, 1, 0, 0, layout.size, mtime, mtime, mtime))
        super().__init__(
            filename, filename=filename, media_type="application/x-tar", stat_result=stat_result,
            headers={"etag": f'"{sha256}"'},
        )
        self.layout = layout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A server offering "pathsend" would be handed self.path to send by itself: no such file.
        extensions = {name: value for name, value in scope.get("extensions", {}).items() if name != "http.response.pathsend"}
        await super().__call__({**scope, "extensions": extensions}, receive, send)

    @asynccontextmanager
    async def _open_file(self):
        reader = self.layout.open()
        try:
            yield _AsyncArchiveReader(reader)
        finally:
            reader.close()
