"""Corpus uploads."""

from __future__ import annotations

import os

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from extension.corpus import CorpusFormat, check_corpus
from extension.errors import InvalidCorpusError

from ..db.models import StoredFile
from ..deps import KeyDep, SessionsDep, SettingsDep
from ..errors import ApiError
from ..quotas import check_storage
from ..schemas import ErrorResponse, FileObject
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
    received = await receive_file(request, partial, settings.max_upload_bytes)
    jsonl = received.filename.lower().endswith((".jsonl", ".ndjson"))
    text_field = received.fields.get("text_field") or "text"
    try:
        documents, _size = await run_in_threadpool(
            check_corpus, partial, fmt=CorpusFormat(jsonl=jsonl, text_field=text_field), label=f"upload {received.filename!r}"
        )
    except InvalidCorpusError as exc:
        await run_in_threadpool(partial.unlink, missing_ok=True)
        raise ApiError(422, exc.code, exc.message, "file") from None
    final = upload_path(settings, file_id, ".jsonl" if jsonl else ".txt")
    await run_in_threadpool(os.replace, partial, final)
    stored = StoredFile(
        id=file_id, owner_id=key.id, filename=received.filename[:255], path=str(final), bytes=received.bytes,
        sha256=received.sha256, documents=documents, source="upload",
    )
    await run_in_threadpool(_save, sessions, stored)
    return file_view(stored)


def _check_storage(sessions, key, settings) -> None:
    with sessions() as db:
        check_storage(db, key, settings)


def _save(sessions, stored: StoredFile) -> None:
    with sessions() as db:
        db.add(stored)
        db.commit()


@router.get("/files/{file_id}", response_model=FileObject, summary="An uploaded corpus", responses={404: {"model": ErrorResponse, "description": "No such file for this API key"}})
def get_file(file_id: str, sessions: SessionsDep, key: KeyDep) -> FileObject:
    with sessions() as db:
        stored = db.get(StoredFile, file_id)
    if stored is None or stored.owner_id != key.id:
        raise ApiError(404, "not_found", f"no file {file_id!r} for this API key", "file_id")
    return file_view(stored)
