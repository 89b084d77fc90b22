"""What a job asks for, and how the pipeline reports back. Shared by CLI, API and worker."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

# The stages run() goes through, in order ("mine" only for corpus jobs without terms). Here, not
# in pipeline.py, so the service can show a job's timeline without importing torch.
STAGES = ("load", "mine", "extend", "init", "train", "evaluate", "publish")


@dataclass
class ExtendSpec:
    base_model: str
    out_dir: Path
    terms: list[str] | None = None
    corpus_path: Path | None = None
    corpus_text_field: str = "text"  # JSONL corpora
    # mining
    max_new_tokens: int = 300
    min_frequency: int = 3
    # tokenizer / init
    max_term_chars: int = 64
    pad_to_multiple_of: int = 64
    # training (TrainConfig and the API schema read their defaults from here)
    steps: int = 100
    batch_size: int = 4
    seq_len: int = 128
    lr: float = 1e-4  # measured best of 1e-3 / 3e-4 / 1e-4 (benchmarks/results/window_sampling.md)
    embedding_lr_multiplier: float = 5.0
    weight_decay: float = 0.0
    warmup_steps: int = 10
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 50
    # evaluation: bytes of held-out domain text and of general text scored before and after
    eval_max_bytes: int = 50_000
    # service-only knobs
    allow_local_paths: bool = True  # the CLI; the service sets False
    force: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()}


def _noop(*_args, **_kwargs):
    return None


@dataclass
class Callbacks:
    """Everything the pipeline tells its caller. All optional; defaults do nothing.

    on_stage(name)                      a stage starts: load, mine, extend, init, train, evaluate, publish
    on_progress(step, total, metrics)   training progress (loss, tokens_per_s, lr)
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
