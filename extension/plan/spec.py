"""What a job asks for, and how the pipeline reports back. Shared by CLI, API and worker."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Callable

from .options import OPTIONS

# The stages run() goes through, in order: "mine" for a corpus job without terms (mining extends
# the tokenizer), "extend" for every other job. Here, not in pipeline.py, so the service can show
# a job's timeline without importing torch.
STAGES = ("load", "mine", "extend", "init", "generate", "train", "select", "evaluate", "publish")


def mines_corpus(spec_or_request) -> bool:
    """Whether a job (an ExtendSpec, or the API's request as a dict) mines its terms from its corpus."""
    if isinstance(spec_or_request, dict):
        return bool(spec_or_request.get("corpus_file_id")) and not spec_or_request.get("terms")
    return spec_or_request.corpus_path is not None and not spec_or_request.terms


def planned_stages(spec_or_request) -> list[str]:
    """The stages a job goes through, in order."""
    skipped = "extend" if mines_corpus(spec_or_request) else "mine"
    return [stage for stage in STAGES if stage != skipped]


def _to_json(self) -> dict[str, Any]:
    data = asdict(self)
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()}


# What a job asks for: its inputs, then every option of extension.plan.options (defaults and ranges
# live there, once), then how the caller runs it. Built from OPTIONS so a new option is one edit.
ExtendSpec = make_dataclass(
    "ExtendSpec",
    [
        ("base_model", str),
        ("out_dir", Path),
        ("terms", "list[str] | None", field(default=None)),
        ("corpus_path", "Path | None", field(default=None)),
        # How messages and reports name the corpus: the name its owner gave it (the CLI: the path
        # as typed). None: "the corpus" — never the file's own name, which may be a server's.
        ("corpus_name", "str | None", field(default=None)),
        # A terms-only job's few documents of the user's own text (training/example_snippets.py)
        ("examples", "list[str] | None", field(default=None)),
        *[(option.name, option.kind if not option.device_defaults else f"{option.kind.__name__} | None",
           field(default=option.unset_default)) for option in OPTIONS],
        ("allow_local_paths", bool, field(default=True)),  # the CLI; the service sets False
        ("force", bool, field(default=False)),  # replace an existing out_dir
    ],
    namespace={"to_json": _to_json},
)
ExtendSpec.__module__ = __name__


def _noop(*_args, **_kwargs):
    return None


@dataclass
class Callbacks:
    """Everything the pipeline tells its caller. All optional; defaults do nothing.

    on_stage(name)                      a stage starts: load, mine, extend, init, generate, train, evaluate, publish
    on_progress(step, total, metrics)   progress within the current stage: training steps (metrics: loss,
                                        tokens_per_s, lr), corpus documents read while mining,
                                        generated contexts and scored evaluation chunks
                                        (metrics: {"unit": "documents" | "contexts" | "chunks"})
    on_event(kind, payload)             anything worth recording (metrics, mined terms, reports)
    on_warning(message)                 something the user should read but that did not stop the job
    should_cancel() -> bool             polled between steps; True stops the job (JobCancelled)
    work_dir                            folder for checkpoints; a job given the same folder resumes
    """

    on_stage: Callable[[str], None] = _noop
    on_progress: Callable[[int, int, dict], None] = _noop
    on_event: Callable[[str, dict], None] = _noop
    on_warning: Callable[[str], None] = _noop
    should_cancel: Callable[[], bool] = lambda: False
    work_dir: Path | None = None
    extra: dict = field(default_factory=dict)
