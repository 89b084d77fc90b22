"""Corpus uploads: store, list, read, delete."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from extension.plan.corpus import CorpusFormat, check_corpus
from extension.errors import InvalidCorpusError

from ..db.files import FileInUse, FileNotFound, owned_file, users_of
from ..db.files import delete_file as db_delete_file
from ..db.files import list_files as db_list_files
from ..db.models import StoredFile
from ..deps import KeyDep, SessionsDep, SettingsDep
from ..errors import ApiError, quoted
from .. import quotas
from ..quotas import check_storage
from ..schemas import ErrorResponse, FileList, FileObject
from ..storage import upload_path
from ..submission import new_file_id
from ..uploads import receive_file
from ..views import file_view
from . import AUTH_ERRORS, INVALID, STORAGE_FULL

router = APIRouter(tags=["files"], responses=AUTH_ERRORS)

_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary", "description": "UTF-8 text (documents separated by blank lines) or .jsonl"},
                        "text_field": {"type": "string", "description": "JSONL only: the field holding the text (default text)"},
                    },
                }
            }
        },
    }
}


@router.post(
    "/files",
    status_code=201,
    response_model=FileObject,
    summary="Upload a corpus (streamed to disk; size-limited; validated as UTF-8)",
    openapi_extra=_UPLOAD_BODY,
    responses={
        **INVALID,
        408: {"model": ErrorResponse, "description": "The body stopped arriving for TIDE_REQUEST_BODY_TIMEOUT_S"},
        413: {"model": ErrorResponse, "description": "Larger than TIDE_MAX_UPLOAD_BYTES"},
        415: {"model": ErrorResponse, "description": "Not multipart/form-data"},
        **STORAGE_FULL,
    },
)
async def upload(request: Request, sessions: SessionsDep, key: KeyDep, settings: SettingsDep) -> FileObject:
    await run_in_threadpool(_check_storage, sessions, key, settings)
    file_id = new_file_id()
    partial = settings.resolved_uploads_dir / f".{file_id}.partial"

    def reserve(needed: int, wanted: int, what: str) -> int:  # called by the parser's thread before it writes
        with sessions() as db:
            return quotas.reserve(db, key, settings, file_id, needed, wanted, what)

    stored = None
    try:
        received = await receive_file(request, partial, settings.max_upload_bytes, reserve=reserve, max_seconds=settings.max_upload_s)
        await run_in_threadpool(_settle, sessions, file_id, received.bytes)
        jsonl = received.filename.lower().endswith((".jsonl", ".ndjson"))
        text_field = received.fields.get("text_field") or "text"
        try:
            documents, _size = await run_in_threadpool(
                check_corpus, partial, fmt=CorpusFormat(jsonl=jsonl, text_field=text_field), label=f"upload {received.filename!r}"
            )
        except InvalidCorpusError as exc:
            raise ApiError(422, exc.code, exc.message, "file") from None
        final = upload_path(settings, file_id, ".jsonl" if jsonl else ".txt")
        await run_in_threadpool(os.replace, partial, final)
        stored = StoredFile(
            id=file_id, owner_id=key.id, filename=received.filename[:255], path=str(final), bytes=received.bytes,
            sha256=received.sha256, documents=documents, source="upload",
        )
        await run_in_threadpool(_save, sessions, stored)
    except BaseException:
        # Whatever stopped it (a refusal, the client gone, a server error), nothing of it is kept
        # and its bytes leave the quota; an API killed here leaves both to the sweeper.
        await asyncio.shield(run_in_threadpool(_forget, sessions, file_id, partial, stored))
        raise
    return file_view(stored)


def _check_storage(sessions, key, settings) -> None:
    with sessions() as db:
        check_storage(db, key, settings)


def _settle(sessions, file_id: str, written: int) -> None:
    with sessions() as db:
        quotas.settle(db, file_id, written)


def _forget(sessions, file_id: str, partial, stored: StoredFile | None) -> None:
    partial.unlink(missing_ok=True)
    if stored is not None:  # renamed into place, but its row was not saved
        Path(stored.path).unlink(missing_ok=True)
    with sessions() as db:
        quotas.release(db, file_id)
        db.commit()


def _save(sessions, stored: StoredFile) -> None:
    """The file's row and the end of its reservation, in one transaction: its bytes are counted once, always."""
    with sessions() as db:
        db.add(stored)
        quotas.release(db, stored.id)
        db.commit()


_NO_FILE = {404: {"model": ErrorResponse, "description": "No such file for this API key"}}


def _not_found(file_id: str) -> ApiError:
    # Another key's file is indistinguishable from no file at all.
    return ApiError(404, "not_found", f"no file {quoted(file_id)} for this API key; list yours with GET /files", "file_id")


@router.get("/files", response_model=FileList, summary="Your stored corpora, newest first, with the jobs that use them")
def list_files(
    sessions: SessionsDep,
    key: KeyDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=64, description="next_cursor from the previous page")] = None,
) -> FileList:
    with sessions() as db:
        after = None
        if cursor is not None:
            try:
                after = owned_file(db, key, cursor)
            except FileNotFound:
                raise ApiError(
                    422, "invalid_request",
                    f"cursor {cursor[:64]!r} is not a page cursor (or its file was deleted since); pass the next_cursor "
                    "value of the previous page, or leave cursor out for the first page",
                    "cursor",
                ) from None
        page = db_list_files(db, key, limit=limit, after=after)
    return FileList(data=[file_view(stored, users) for stored, users in page.files], next_cursor=page.next_cursor)


@router.get("/files/{file_id}", response_model=FileObject, summary="A stored corpus", responses=_NO_FILE)
def get_file(file_id: str, sessions: SessionsDep, key: KeyDep) -> FileObject:
    with sessions() as db:
        try:
            stored = owned_file(db, key, file_id)
        except FileNotFound:
            raise _not_found(file_id) from None
        return file_view(stored, users_of(db, [stored.id])[stored.id])


@router.delete(
    "/files/{file_id}",
    status_code=204,
    summary="Delete a stored corpus; its bytes leave the key's storage quota",
    responses={**_NO_FILE, 409: {"model": ErrorResponse, "description": "A queued or running job uses the file"}},
)
def delete_file(file_id: str, sessions: SessionsDep, key: KeyDep) -> Response:
    with sessions() as db:
        try:
            db_delete_file(db, key, file_id)
        except FileNotFound:
            raise _not_found(file_id) from None
        except FileInUse as exc:
            job = exc.user.job_id
            raise ApiError(
                409, "file_in_use",
                f"file {file_id} is the corpus of job {job}, which is {exc.user.status}; wait until it finishes "
                f"(GET /jobs/{job}) or cancel it (POST /jobs/{job}/cancel), then delete the file",
                "file_id",
            ) from None
    return Response(status_code=204)
