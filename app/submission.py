"""POST /extend, minus HTTP: validate a request against the server's limits, store the job.

Everything a client can get wrong is caught here, before a job is queued, and answered with
the field at fault: the worker should fail only for reasons nobody could see at submit time.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from extension.plan.corpus import check_corpus, check_examples
from extension.errors import InvalidCorpusError, TideError
from extension.plan.models import BUILTIN_MODELS, resolve_model
from extension.plan.options import BY_NAME, device_kinds, planned_steps

from .base_tokenizers import BaseTokenizers
from .db.jobs import add_event, new_job_id
from .db.models import ApiKey, Job, StoredFile
from .errors import ApiError, quoted
from .quotas import check_new_job
from .schemas import ExtendRequest
from .settings import Settings
from .storage import upload_path
from .terms import check_reserved_ids, check_terms_add_something, validate_terms
from .uploads import write_corpus


def new_file_id() -> str:
    return "file_" + uuid.uuid4().hex


def check_base_model(name: str, settings: Settings) -> None:
    # Built-ins are accepted by name: resolving one converts its GGUF (tens of seconds), which
    # is the worker's job, not the request's.
    if name in BUILTIN_MODELS:
        return
    resolve_model(name, settings.model_sources(), allow_local_paths=False)


def _request_hash(request: ExtendRequest) -> str:
    return hashlib.sha256(json.dumps(request.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def steps_on_worker(request: ExtendRequest, settings: Settings) -> list[int]:
    """The training steps this job can run: as asked, else the default of the workers' device
    (the TIDE_DEVICE and TIDE_PRECISION settings; where each worker's device decides, any of its
    defaults)."""
    if request.training.steps is not None:
        return [request.training.steps]
    values = SimpleNamespace(**request.training.model_dump(), terms=request.terms, examples=request.examples,
                             corpus_path=request.corpus_file_id or request.corpus_text)
    return sorted({planned_steps(values, kind) for kind in device_kinds(settings.device, settings.precision)})


def _known_total(steps: list[int]) -> int:
    return steps[0] if len(steps) == 1 else 0  # 0: the worker's device decides, and reports it as it trains


def _check_limits(request: ExtendRequest, settings: Settings) -> None:
    steps = max(steps_on_worker(request, settings))
    if steps > settings.max_steps:
        asked = f"is {steps}" if request.training.steps is not None else (
            f"is unset, and its default on this server's workers can be {steps} ({BY_NAME['steps'].default_text})")
        raise ApiError(422, "invalid_option", f"training.steps {asked}; this server allows at most {settings.max_steps}: "
                       f"give training.steps at most {settings.max_steps}", "training.steps")
    if request.terms is None and request.corpus_file_id is None and request.corpus_text is None:
        raise ApiError(
            422, "invalid_request",
            "give the new words as terms, or a corpus to mine them from (corpus_file_id from POST /files, or corpus_text)",
            "terms",
        )
    if request.corpus_file_id is not None and request.corpus_text is not None:
        raise ApiError(422, "invalid_request", "give one corpus: corpus_file_id or corpus_text, not both", "corpus_text")
    if request.examples is not None:
        if request.terms is None:
            raise ApiError(422, "invalid_request", "examples go with terms: give the terms they show in use", "examples")
        try:
            check_examples(request.examples, has_corpus=request.corpus_file_id is not None or request.corpus_text is not None)
        except TideError as exc:
            raise ApiError(422, exc.code, exc.message, "examples") from None
    if request.corpus_text is not None and len(request.corpus_text) > settings.max_corpus_text_chars:
        raise ApiError(
            422, "invalid_corpus",
            f"corpus_text has {len(request.corpus_text)} characters; the inline limit is {settings.max_corpus_text_chars} — "
            "upload bigger corpora with POST /files and pass corpus_file_id",
            "corpus_text",
        )


def _file_not_found(file_id: str) -> ApiError:
    return ApiError(422, "file_not_found", f"no uploaded file {quoted(file_id)} for this API key; upload the corpus with POST /files first", "corpus_file_id")


def _own_file(db: Session, key: ApiKey, file_id: str) -> StoredFile:
    stored = db.get(StoredFile, file_id)
    if stored is None or stored.owner_id != key.id or not Path(stored.path).is_file():
        raise _file_not_found(file_id)
    return stored


def _write_inline_corpus(key: ApiKey, text: str, settings: Settings) -> StoredFile:
    """Write corpus_text the way POST /files writes an upload (a partial file, the same 507 on a
    full disk), check it, rename it into place; the row is not added to the session yet."""
    file_id = new_file_id()
    path = upload_path(settings, file_id, ".txt")
    partial = path.with_name(f".{file_id}.partial")
    data = text.encode("utf-8")
    write_corpus(partial, data, "corpus_text")
    try:
        documents, _size = check_corpus(partial, label="corpus_text")
        os.replace(partial, path)
    except InvalidCorpusError as exc:
        partial.unlink(missing_ok=True)
        raise ApiError(422, exc.code, exc.message, "corpus_text") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return StoredFile(
        id=file_id, owner_id=key.id, filename="corpus_text.txt", path=str(path), bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(), documents=documents, source="inline",
    )


def existing_job(db: Session, key: ApiKey, idempotency_key: str | None) -> Job | None:
    if idempotency_key is None:
        return None
    return db.scalar(select(Job).where(Job.owner_id == key.id, Job.idempotency_key == idempotency_key))


def _replay(job: Job, request_hash: str) -> Job:
    if job.request_hash != request_hash:
        raise ApiError(
            409, "idempotency_key_reused",
            "this Idempotency-Key was already used for a different request; use a new key for a new job",
            "Idempotency-Key",
        )
    return job


def _check_text_field(stored: StoredFile, text_field: str) -> None:
    """A JSONL upload was checked with the text field named at upload; a job may name another."""
    if Path(stored.path).suffix != ".jsonl" or (stored.id, stored.sha256, text_field) in _CHECKED_FIELDS:
        return
    try:
        check_corpus(Path(stored.path), text_field=text_field, label=f"upload {stored.filename!r}")
    except InvalidCorpusError as exc:
        raise ApiError(
            422, exc.code, f"{exc.message} (corpus_text_field is {text_field!r}; set it to the field that holds the text)",
            "corpus_text_field",
        ) from None
    _CHECKED_FIELDS[(stored.id, stored.sha256, text_field)] = True
    while len(_CHECKED_FIELDS) > 1024:
        _CHECKED_FIELDS.popitem(last=False)


# (file id, sha256, text field) of JSONL uploads already read through with that field: a retry
# or a second job on the same upload does not read it again.
_CHECKED_FIELDS: OrderedDict[tuple[str, str, str], bool] = OrderedDict()

_DEFERRED_TERMS_CHECK = (
    "the tokenizer of {model} is not on this server yet, so the worker checks that the terms add something "
    "(a job whose every term is already one token of the base model fails there)"
)


_DEFERRED_RESERVED_CHECK = (
    "the tokenizer of {model} is not on this server yet, so the worker checks that it has enough free reserved "
    "tokens for new_ids 'reserved' (before it loads any weights)"
)


def submit(
    db: Session, key: ApiKey, request: ExtendRequest, settings: Settings, idempotency_key: str | None,
    tokenizers: BaseTokenizers | None = None, count_submit: Callable[[str], None] | None = None,
) -> tuple[Job, bool]:
    """Store a new queued job. Returns (job, created); created is False for an idempotent replay.
    With `tokenizers`, terms that would add nothing to the base model are refused here;
    `count_submit(key_id)` counts a valid new submit against the key's rate (429 beyond it)."""
    if idempotency_key is not None and not (1 <= len(idempotency_key) <= 255):
        raise ApiError(422, "invalid_request", "Idempotency-Key must be 1 to 255 characters", "Idempotency-Key")
    request_hash = _request_hash(request)
    previous = existing_job(db, key, idempotency_key)
    if previous is not None:
        return _replay(previous, request_hash), False

    if request.terms is not None:  # first: a terms-only job's default steps depend on how many terms it lists
        validate_terms(request.terms, settings)
    _check_limits(request, settings)
    try:
        check_base_model(request.base_model, settings)
    except TideError as exc:
        raise ApiError(422, exc.code, exc.message, "base_model") from None
    deferred: list[str] = []
    tokenizer = None
    if request.terms is not None:
        tokenizer = tokenizers.get(request.base_model) if tokenizers is not None else None
        if tokenizer is not None:
            check_terms_add_something(request.terms, tokenizer, request.base_model, settings)
        else:
            deferred.append(_DEFERRED_TERMS_CHECK.format(model=request.base_model))
    if request.new_ids == "reserved":
        if tokenizer is None and tokenizers is not None:
            tokenizer = tokenizers.get(request.base_model)
        if tokenizer is not None:
            check_reserved_ids(request, tokenizer, tokenizers.folder(request.base_model), settings)
        else:
            deferred.append(_DEFERRED_RESERVED_CHECK.format(model=request.base_model))
    corpus = inline = None
    if request.corpus_file_id is not None:
        corpus = _own_file(db, key, request.corpus_file_id)
        _check_text_field(corpus, request.corpus_text_field)
    elif request.corpus_text is not None:
        corpus = inline = _write_inline_corpus(key, request.corpus_text, settings)
    # Only a request valid in every other way counts against the key's limits: a 429 or 507 must
    # never stand in for a 422 that waiting would not cure.
    try:
        if count_submit is not None:
            count_submit(key.id)
        check_new_job(db, key, settings, inline.bytes if inline is not None else 0)  # holds the key's row until the commit
    except ApiError:
        if inline is not None:
            Path(inline.path).unlink(missing_ok=True)
        raise
    if inline is not None:
        db.add(inline)
        db.flush()  # the file row must exist before the job row that references it

    stored_request = request.model_dump(mode="json", exclude={"corpus_text"})
    if corpus is not None:
        stored_request["corpus_file_id"] = corpus.id
    job = Job(
        id=new_job_id(), owner_id=key.id, idempotency_key=idempotency_key, request_hash=request_hash,
        request=stored_request, base_model=request.base_model,
        corpus_file_id=corpus.id if corpus is not None else None,
        progress_total=_known_total(steps_on_worker(request, settings)),
    )
    db.add(job)
    # read before the flush: a rollback expires the corpus row, which a concurrent delete may have removed
    inline_path = Path(inline.path) if inline is not None else None
    try:
        db.flush()
    except IntegrityError:
        # A concurrent retry with the same Idempotency-Key won the race: answer with its job.
        db.rollback()
        if inline_path is not None:
            inline_path.unlink(missing_ok=True)
        previous = existing_job(db, key, idempotency_key)
        if previous is None:
            if request.corpus_file_id is not None and db.get(StoredFile, request.corpus_file_id) is None:
                # DELETE /files/{id} won the race since the file was looked up: as if it never was
                raise _file_not_found(request.corpus_file_id) from None
            raise
        return _replay(previous, request_hash), False
    add_event(db, job.id, "status", {"status": "queued"})
    for message in deferred:
        add_event(db, job.id, "check_deferred", {"message": message})
    db.commit()
    return job, True
