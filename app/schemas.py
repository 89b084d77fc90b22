"""Request and response bodies of the HTTP API (with the examples shown at /docs)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from extension.plan.options import OPTIONS, Option

JobStatus = Literal["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable name, e.g. model_not_found, invalid_terms")
    message: str = Field(description="What was wrong and how to fix it")
    param: str | None = Field(None, description="The request field at fault, e.g. base_model or terms[2]")


class ErrorResponse(BaseModel):
    error: ErrorBody

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"error": {"code": "model_not_found", "message": "unknown base model 'llama-9000'; available: gemma3-270m, smollm2-135m", "param": "base_model"}}
            ]
        }
    )


def _field(option: Option) -> tuple[type, Any]:
    """A pydantic field of `option`: its default, range and help, as /docs shows them."""
    if option.choices:
        return Literal[option.choices], Field(option.default, description=option.help[:1].upper() + option.help[1:])
    if option.kind is str:
        bounds = {"min_length": int(option.minimum), "max_length": int(option.maximum)}
    else:
        bounds = {"gt" if option.exclusive_minimum else "ge": option.minimum, "le": option.maximum}
    description = option.help[:1].upper() + option.help[1:]
    if option.device_defaults:  # unset: the worker fills in its device's default
        return option.kind | None, Field(None, description=f"{description}. Default: {option.default_text}", **bounds)
    return option.kind, Field(option.default, description=description, **bounds)


def _group_model(group: str, doc: str) -> type[BaseModel]:
    fields = {option.api_name or option.name: _field(option) for option in OPTIONS if option.api_group == group}
    model = create_model(f"{group.capitalize()}Options", __config__=_STRICT, **fields)
    model.__doc__ = doc
    return model


MiningOptions = _group_model("mining", "How terms are chosen from a corpus (used only when no `terms` are given).")
TrainingOptions = _group_model("training", "Training of the new rows only (the base model stays frozen; steps at most TIDE_MAX_STEPS).")
EvaluationOptions = _group_model("evaluation", "The before/after measurement (bits per byte on held-out domain text and on general text).")
_ROOT_OPTIONS = {option.api_name or option.name: _field(option) for option in OPTIONS if option.api_group == "root"}


class _ExtendRequestBase(BaseModel):
    """Give `terms`, or a corpus (`corpus_file_id` from POST /files, or a small inline `corpus_text`), or both."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {"base_model": "smollm2-135m", "terms": ["immunohistochemistry", "pharmacokinetics"], "training": {"steps": 50}},
                {"base_model": "smollm2-135m", "corpus_file_id": "file_0123456789abcdef0123456789abcdef", "mining": {"max_new_tokens": 200}},
            ]
        },
    )

    base_model: str = Field(
        min_length=1, max_length=200, description="A built-in name (smollm2-135m, gemma3-270m) or a folder name under the server's models directory (see GET /models)"
    )
    terms: list[str] | None = Field(None, description="Words or phrases that should each become one token")
    corpus_file_id: str | None = Field(None, max_length=64, description="An uploaded corpus (POST /files): mined for terms when none are given, and trained on")
    corpus_text: str | None = Field(None, description="A small corpus inline (documents separated by blank lines)")
    examples: list[str] | None = Field(
        None, description="With terms and no corpus: a few documents of your own text (each a string). Snippets around "
        "each term train its rows before generated contexts do, and a part of the documents is held out to judge the "
        "published model on your text (at most 1,000 documents, 1,000,000 characters)")
    mining: MiningOptions = Field(default_factory=MiningOptions)
    training: TrainingOptions = Field(default_factory=TrainingOptions)
    evaluation: EvaluationOptions = Field(default_factory=EvaluationOptions)


# The root-level options (corpus_text_field, pad_to_multiple_of) come from the option table too.
ExtendRequest = create_model("ExtendRequest", __base__=_ExtendRequestBase, **_ROOT_OPTIONS)
ExtendRequest.__doc__ = _ExtendRequestBase.__doc__


class Progress(BaseModel):
    step: int
    total: int
    percent: float


class ArtifactLinks(BaseModel):
    manifest_url: str = Field(description="GET it for the file list with sizes and sha256")
    archive_url: str = Field(description="The whole model as one .tar (supports Range, so downloads resume)")
    expires_at: datetime | None


class Job(BaseModel):
    id: str
    status: JobStatus
    stage: str | None = Field(
        description="load, mine, extend, init, generate (terms-only jobs: the base model writes contexts for the terms), "
        "train, evaluate or publish"
    )
    progress: Progress = Field(
        description="Progress within the current stage: training steps (train), corpus documents read (mine), contexts "
        "written (generate), text chunks scored (evaluate); 0 of 0 in a stage that has not counted yet. A queued job shows 0 "
        "of its training steps"
    )
    base_model: str
    attempt: int = Field(description="How many times a worker has started this job")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    error: ErrorBody | None
    metrics: dict[str, Any] | None
    mined_terms: list[Any] | None = Field(description="Terms chosen from the corpus (corpus jobs)")
    artifacts: ArtifactLinks | None
    request: dict[str, Any] = Field(description="The request as accepted, defaults filled in")


class JobList(BaseModel):
    data: list[Job]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page")


class Event(BaseModel):
    id: int = Field(description="Increasing; pass the last one seen as ?after= to get only newer events")
    kind: str = Field(description="status, stage, progress, metrics, warning, …")
    payload: dict[str, Any]
    created_at: datetime


class EventList(BaseModel):
    data: list[Event]
    next_after: int = Field(description="Use as ?after= on the next poll")


class FileJob(BaseModel):
    id: str
    status: JobStatus


class FileObject(BaseModel):
    id: str
    filename: str = Field(description="The name the upload gave (at most 255 characters), as given")
    bytes: int = Field(description="Counted against the key's TIDE_MAX_STORED_BYTES_PER_KEY until the file is deleted")
    sha256: str
    documents: int = Field(description="Documents found (blank-line separated text, or JSONL records)")
    source: Literal["upload", "inline"] = Field(
        "upload", description="upload: POST /files; inline: a POST /extend corpus_text, deleted with its job"
    )
    jobs: list[FileJob] = Field(
        default_factory=list,
        description="Jobs that use this corpus, newest first; while one is queued or running the file cannot be deleted",
    )
    created_at: datetime


class FileList(BaseModel):
    data: list[FileObject]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page")


class ArtifactFile(BaseModel):
    path: str
    size: int
    sha256: str
    url: str


class Archive(BaseModel):
    url: str
    filename: str
    size: int
    sha256: str


class Artifacts(BaseModel):
    job_id: str
    files: list[ArtifactFile]
    archive: Archive
    expires_at: datetime | None


class ModelInfo(BaseModel):
    name: str
    kind: Literal["builtin", "models_dir"]
    description: str | None


class ModelList(BaseModel):
    data: list[ModelInfo]


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready"]
    database: Literal["ok"]
    redis: Literal["ok"]
    workers: int = Field(description="Workers that answered a ping")
