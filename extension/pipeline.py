"""run(spec, callbacks) -> result: the job, one call per stage, in the order of plan.spec.STAGES.

The CLI and the worker call only this. Everything the service needs goes through `callbacks`
(stage changes, progress, events, warnings, the cancel check, a work folder for checkpoints).
Each stage's code lives in its package's stage.py; this module only runs them in order and says
what passes from one to the next.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from .errors import JobCancelled
from .evaluation.stage import evaluate_job
from .mining.stage import mine_corpus
from .plan import devices as job_devices
from .plan.job import JobPlan, offload_folder, plan_inputs, plan_model
from .plan.models import ModelSources, load_model
from .plan.spec import STAGES, Callbacks, ExtendSpec
from .publishing.stage import PipelineResult, publish_job
from .rows.stage import start_rows
from .selection.stage import choose_terms
from .tokenizer.stage import extend_with_terms, take_reserved_ids
from .training import TrainConfig, max_positions, trainer_checkpoint
from .training.stage import train_new_rows, write_texts

DEFAULT_SOURCES = ModelSources(cache_dir=Path.home() / ".cache" / "tide")

__all__ = ["run", "PipelineResult", "DEFAULT_SOURCES", "STAGES", "ExtendSpec", "Callbacks"]


def run(spec: ExtendSpec, callbacks: Callbacks | None = None, sources: ModelSources | None = None) -> PipelineResult:
    """The job, stage by stage. Every decision that needs no weights is made first, in the plan."""
    callbacks = callbacks or Callbacks()
    sources = sources or DEFAULT_SOURCES
    plan = plan_inputs(spec)  # options, output folder, corpus, device: no model read yet
    torch.manual_seed(plan.spec.seed)
    spec, stage = plan.spec, _Stages(callbacks)

    with stage("load"):
        plan, model, checkpoint = load_base(plan, sources, callbacks)
    spec = plan.spec  # new_ids 'auto' is now 'append' or 'reserved' (plan/new_ids.py)
    tokenizer, rows_in_use = plan.tokenizer, model.get_input_embeddings().weight.shape[0]
    mined = None
    if plan.mines_corpus:  # a corpus and no terms: mining chooses the terms and extends the tokenizer
        with stage("mine"):
            mined = mine_corpus(spec, tokenizer, callbacks, documents=plan.corpus_documents, embedding_rows=rows_in_use)
        extended = mined.extended
    else:
        with stage("extend"):
            extended = extend_with_terms(spec, tokenizer, callbacks, embedding_rows=rows_in_use)
    with stage("init"):
        start = start_rows(spec, model, tokenizer, extended, callbacks)
    with stage("generate"):
        texts = write_texts(spec, model, tokenizer, extended, callbacks, init=start.method)
    with stage("train"):
        trained = train_new_rows(spec, model, extended, start, texts, callbacks)
    with stage("select"):
        chosen = choose_terms(spec, model, tokenizer, extended, trained, texts, start, mined, callbacks)
        if plan.reserved is not None:  # new_ids 'reserved': before evaluation, so what is evaluated is published
            chosen = replace(chosen, extended=take_reserved_ids(chosen.extended, plan.reserved, spec, callbacks))
    with stage("evaluate"):
        metrics, layout = evaluate_job(plan, model, chosen, trained, callbacks, scores_dir=Path(sources.cache_dir) / "scores",
                                       scores_max_bytes=sources.score_cache_max_bytes, stages_run=list(stage.seconds))
    with stage("publish"):
        result = publish_job(plan, model, sources, chosen=chosen, trained=trained, start=start, mined=mined,
                             metrics=metrics, layout=layout, checkpoint=checkpoint)
    return replace(result, seconds=stage.seconds)


def load_base(plan: JobPlan, sources: ModelSources, callbacks: Callbacks):
    """(the plan completed from the model's tokenizer and config, the base model frozen on its
    device in its compute dtype, the base's Trainer checkpoint or None). A Trainer checkpoint as the
    base is checked now (layout, optimizer kind) and carried over at publish."""
    plan = plan_model(plan, sources)  # tokenizer, config, dtype, memory: no weights read yet
    callbacks.on_event("memory_plan", plan.memory.to_json())
    if plan.new_ids_reason:
        callbacks.on_event("new_ids", {"new_ids": plan.spec.new_ids, "reason": plan.new_ids_reason})
    model = load_model(plan.resolved, sources, placement=plan.placement,
                       offload_folder=offload_folder(plan, callbacks.work_dir)).eval()
    model.requires_grad_(False)
    job_devices.check_spread(model)
    TrainConfig.from_spec(plan.spec).validate(max_positions=max_positions(model))
    checkpoint = trainer_checkpoint(plan.resolved.path, model) if plan.resolved.kind in ("local", "models_dir") else None
    return plan, model, checkpoint


class _Stages:
    """Announce stages, time them, and honour cancellation before each one."""

    def __init__(self, callbacks: Callbacks):
        self.callbacks = callbacks
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        assert name in STAGES, name
        if self.callbacks.should_cancel():
            raise JobCancelled(f"cancelled before {name}")
        self.callbacks.on_stage(name)
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - started, 2)
