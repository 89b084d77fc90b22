"""run(spec, callbacks) -> result: load -> (mine) -> extend -> init -> (generate) -> train -> evaluate -> publish.

The CLI and the worker call only this. Everything the service needs goes through `callbacks`
(stage changes, progress, events, warnings, the cancel check, a work folder for checkpoints).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any
from pathlib import Path

import torch

from .plan import corpus as corpus_io
from .publishing.card import model_card
from .errors import InvalidCorpusError, InvalidTermsError, JobCancelled
from .plan.job import JobPlan, corpus_label, offload_folder, plan_inputs, plan_model
from .plan.models import ModelSources, load_model
from .publishing.folder import publish
from .publishing.decisions import decision_sentences
from .plan.spec import STAGES, Callbacks, ExtendSpec  # noqa: F401  (STAGES: the order run() follows)

DEFAULT_SOURCES = ModelSources(cache_dir=Path.home() / ".cache" / "tide")


@dataclass
class PipelineResult:
    out_dir: Path
    metrics: dict
    manifest: list[dict]
    extension: dict
    mined_terms: list[dict] | None = None
    seconds: dict = field(default_factory=dict)

    def summary(self) -> str:
        counts = self.extension.get("counts", {})
        lines = [
            f"Extended model written to {self.out_dir}",
            f"  terms added: {counts.get('terms_added', '?')}, new vocabulary entries: "
            f"{counts.get('new_vocab_entries', '?')}, skipped: {counts.get('skipped', 0)}",
        ]
        for key, row in self.metrics.get("comparison", {}).items():
            if "before" in row:
                lines.append(f"  {key}: {row['before']:.4f} -> {row['after']:.4f}")
        lines += [f"  {sentence}" for sentence in decision_sentences(self.metrics, style="cli")]
        lines.append(f"  time: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items()))
        return "\n".join(lines)


class _Stages:
    """Announce stages, time them, and honour cancellation between them."""

    def __init__(self, callbacks: Callbacks):
        self.callbacks = callbacks
        self.seconds: dict[str, float] = {}
        self._current: str | None = None
        self._started = 0.0

    def enter(self, name: str) -> None:
        self.close()
        if self.callbacks.should_cancel():
            raise JobCancelled(f"cancelled before {name}")
        self._current, self._started = name, time.perf_counter()
        self.callbacks.on_stage(name)

    def close(self) -> None:
        if self._current:
            self.seconds[self._current] = round(time.perf_counter() - self._started, 2)
            self._current = None


def run(spec: ExtendSpec, callbacks: Callbacks | None = None, sources: ModelSources | None = None) -> PipelineResult:
    """The job, stage by stage. Every decision that needs no weights is made first, in the plan."""
    from .training.optimizer_state import trainer_checkpoint

    callbacks = callbacks or Callbacks()
    sources = sources or DEFAULT_SOURCES
    stages = _Stages(callbacks)
    plan = plan_inputs(spec)  # options, output folder, corpus, device
    torch.manual_seed(plan.spec.seed)

    stages.enter("load")
    plan = plan_model(plan, sources)  # tokenizer, config, dtype, memory: no weights read yet
    callbacks.on_event("memory_plan", plan.memory.to_json())
    model = _load_model(plan, sources, callbacks)
    # A Trainer checkpoint as the base: checked now (layout, optimizer kind), carried at publish.
    run_checkpoint = trainer_checkpoint(plan.resolved.path, model) if plan.resolved.kind in ("local", "models_dir") else None

    vocabulary = new_vocabulary(plan.spec, model, plan.tokenizer, callbacks, stages, corpus_documents=plan.corpus_documents)

    stages.enter("evaluate")
    metrics, init_report = _evaluate(plan, model, vocabulary, callbacks, sources, stages)

    stages.enter("publish")
    result = _publish(plan, model, vocabulary, metrics, init_report, run_checkpoint, sources)
    stages.close()
    return replace(result, seconds=stages.seconds)


def _load_model(plan: JobPlan, sources: ModelSources, callbacks: Callbacks):
    """The base model, straight onto its device in its compute dtype, frozen."""
    from .plan import devices as job_devices
    from .training.loop import TrainConfig, max_positions

    model = load_model(plan.resolved, sources, placement=plan.placement,
                       offload_folder=offload_folder(plan, callbacks.work_dir)).eval()
    model.requires_grad_(False)
    job_devices.check_spread(model)
    TrainConfig.from_spec(plan.spec).validate(max_positions=max_positions(model))
    return model


def _evaluate(plan: JobPlan, model, vocabulary: "NewVocabulary", callbacks: Callbacks, sources: ModelSources,
              stages: "_Stages") -> tuple[dict, dict]:
    """Before/after on the test split and general text, with the published rows applied in
    between (padding rows placed and measured). Returns (metrics, the rows' init report)."""
    from .plan import devices as job_devices
    from .evaluation import compare, evaluate_model, load_general_text
    from .rows.init import apply_rows
    from .evaluation.score_cache import ScoreCache

    spec, extended = plan.spec, vocabulary.extended
    job_devices.release_cached_memory(job_devices.model_device(model))
    general = load_general_text()
    held_out = _held_out_docs(plan)
    # The base model's scores of this text are kept across jobs (extension/evaluation/score_cache.py).
    score_cache = ScoreCache.for_model(Path(sources.cache_dir) / "scores", model, sources.score_cache_max_bytes)
    common = dict(max_bytes=spec.eval_max_bytes, batch_tokens=plan.eval_batch_tokens)
    # Two passes over the same chunks (before, then after): one progress bar across both.
    before = evaluate_model(model, plan.tokenizer, held_out, general, score_cache=score_cache, **common,
                            on_progress=lambda done, total: callbacks.on_progress(done, 2 * total, {"unit": "chunks"}))
    init_report = apply_rows(model, vocabulary.rows, base_vocab_size=extended.base_vocab_size,
                             pad_to_multiple_of=spec.pad_to_multiple_of, calibration_ids=_calibration_ids(plan.tokenizer, general))
    if init_report.get("padding_probability_ok") is False:
        callbacks.on_warning(
            f"padding rows take up to {init_report['padding_probability_max']:.2e} of the probability "
            "on general text (limit 1e-4); generation_config.suppress_tokens lists them"
        )
    after = evaluate_model(model, extended.tokenizer, held_out, general, new_token_ids=[t.id for t in extended.new_tokens],
                           **common, on_progress=lambda done, total: callbacks.on_progress(total + done, 2 * total, {"unit": "chunks"}))
    held_out = _held_out_contexts(vocabulary.selection)
    if held_out is not None:  # a terms-only job: compared with the base model on its held-out contexts too
        before["held_out_contexts"], after["held_out_contexts"] = held_out
    on_model = job_devices.describe(model)
    metrics = {
        "before": before,
        "after": after,
        "comparison": compare(before, after),
        "padding": {k: v for k, v in init_report.items() if k != "padding_ids"},
        # steps taken, steps planned and why it stopped (train.STOP_REASONS), then the loss history
        "training": {**(vocabulary.trained.report() if vocabulary.trained else {"steps": 0}),
                     "history": vocabulary.trained.history if vocabulary.trained else []},
        "selection": {k: v for k, v in vocabulary.selection.items() if k != "effects"},
        "devices": {"load": on_model, **_stage_devices(stages, on_model, trained=vocabulary.trained is not None),
                    "evaluate": dict(on_model), "padding_calibration": dict(on_model)},
        "memory_plan": plan.memory.to_json(),
        "evaluation_cache": {"before": score_cache.report()},
    }
    callbacks.on_event("metrics", {"comparison": metrics["comparison"]})
    return metrics, init_report


def _held_out_contexts(selection: dict) -> tuple[dict, dict] | None:
    """(before, after) on a terms-only job's held-out contexts: the base model reading the base
    tokenizer's ids and the published rows reading the extended tokenizer's, on the same text, in
    bits per byte (never per token: the two tokenizers cut it differently). Both were scored by
    selection already (the validation set and measure_terms): no text is scored twice. None for
    corpus jobs (their test split is the domain text) and jobs without validation."""
    validation = selection.get("validation") or {}
    if validation.get("source") != "held-out generated contexts" or "bits_per_byte" not in selection:
        return None
    size = {"bytes": validation["bytes"], "chunks": validation["chunks"]}
    return ({"bits_per_byte": validation["base_bits_per_byte"], "tokens_per_byte": validation.get("base_tokens_per_byte"), **size},
            {"bits_per_byte": selection["bits_per_byte"], "tokens_per_byte": selection.get("tokens_per_byte"), **size})


def _publish(plan: JobPlan, model, vocabulary: "NewVocabulary", metrics: dict, init_report: dict, run_checkpoint,
             sources: ModelSources) -> PipelineResult:
    """Write the checkpoint, adapter, tokenizer, card and manifest. The published weights are in
    the base checkpoint's dtype with the old rows bit-identical to its files: the job's model when
    it holds exactly those (a CPU job), else the checkpoint loaded again on the CPU with the same
    rows written in (a bf16 GPU job of an fp32 checkpoint, or a model spread with weights offloaded)."""
    from .plan import devices as job_devices

    spec, extended, mined = plan.spec, vocabulary.extended, vocabulary.mined
    model = _publishable(model, plan, sources, vocabulary.rows, extended.base_vocab_size)
    metrics["devices"]["publish"] = job_devices.describe(model)
    steps_done = vocabulary.trained.steps_done if vocabulary.trained else 0
    extension = {
        "base_model": {"name": spec.base_model, "source": plan.resolved.kind},
        # corpus_path is where the file lay on the machine that ran the job: corpus_name says which corpus it was
        "spec": {k: v for k, v in spec.to_json().items() if k not in {"terms", "out_dir", "force", "corpus_path"}},
        # the options the job left to its device, and what that device made them
        "device_defaults": {"device": plan.placement.defaults_kind, "options": plan.device_defaults},
        "init": vocabulary.init,
        "trained_steps": steps_done,
        "training": {k: v for k, v in metrics["training"].items() if k != "history"},
        "published_step": vocabulary.selection.get("best_step", steps_done),
        "vocab": {k: init_report[k] for k in ("base_vocab_size", "vocab_size", "tied")},
        "padding_ids": init_report["padding_ids"],
        **extended.to_json(),
        "selection": vocabulary.selection,
    }
    if mined is not None:
        extension["mining"] = mined.to_json()
    write_extra = None
    if run_checkpoint is not None:
        optimizer_state, carried = run_checkpoint.extend(model, base_vocab_size=extended.base_vocab_size,
                                                         adapter_optimizer_state=vocabulary.optimizer_state)
        carried["files"] = run_checkpoint.write_list()
        extension["trainer_checkpoint"] = carried
        write_extra = lambda staging: run_checkpoint.write(staging, optimizer_state)  # noqa: E731
    history = metrics["training"]["history"]
    manifest = publish(
        spec.out_dir, model=model, tokenizer=extended.tokenizer, extension=extension, metrics=metrics,
        model_card=model_card(spec, extension, metrics, history), history=history,
        adapter_token_ids=list(range(extended.base_vocab_size, init_report["vocab_size"])),
        adapter_target_module=_embedding_module_name(model), write_extra=write_extra, force=spec.force,
        max_shard_bytes=plan.max_shard_bytes,
    )
    return PipelineResult(out_dir=Path(spec.out_dir), metrics=metrics, manifest=manifest, extension=extension,
                          mined_terms=list(extension["mining"].get("terms", [])) if mined else None)


def _stage_devices(stages: "_Stages", on_model: dict, *, trained: bool) -> dict:
    """Where each stage before evaluation did its work: the tokenizer stages on the CPU, the
    model stages on the model's device."""
    placed = {name: {"device": "cpu", "dtype": None, "work": "tokenizer"} for name in ("mine", "extend") if name in stages.seconds}
    placed.update({name: dict(on_model) for name in ("init", "generate", "train") if name in stages.seconds})
    if trained:
        placed["train"]["rows_dtype"] = "float32"
    return placed


@dataclass
class NewVocabulary:
    extended: Any  # tokenizer.ExtendedTokenizer
    rows: Any  # init.NewRows: trained when `trained` is set, else the initial rows
    trained: Any = None  # train.TrainResult (history, steps done, the rows' AdamW state)
    mined: Any = None  # mining.MiningResult for corpus jobs without terms
    selection: dict = field(default_factory=dict)  # what validation decided (tide_extension.json "selection")
    optimizer_state: Any = None  # the published rows' AdamW state (trained.optimizer_state, kept rows only)
    init: dict = field(default_factory=dict)  # how the rows started (init.RowInitializer.report)


def new_vocabulary(spec: ExtendSpec, model, tokenizer, callbacks: Callbacks, stages: "_Stages | None" = None,
                   *, corpus_documents: int = 0) -> NewVocabulary:
    """The stages that make the new rows: mine or extend the tokenizer, init, train, and choose
    what to publish on the validation text (the best step; for corpus jobs, the terms that pay).
    Shared by `run` and by extending a live Trainer run (extension.live). The rows are trained on
    `model` itself, where it is (never a copy of it)."""
    from .rows.init import RowInitializer, init_method, row_method
    from .training.objectives import build_training_data
    from .tokenizer import nothing_to_add_error

    stages = stages or _Stages(callbacks)
    mined = None
    if spec.corpus_path is not None and not spec.terms:
        stages.enter("mine")
        mined = _mine(spec, tokenizer, callbacks, corpus_documents, embedding_rows=embedding_rows(model))
        extended = mined.extended
    else:
        stages.enter("extend")
        extended = _extend(spec, tokenizer, callbacks, embedding_rows=embedding_rows(model))
    if not extended.new_tokens:
        if mined is None:  # the user's terms: the very error the API gives at submit when it can check
            error = nothing_to_add_error(spec.terms or [], extended.skipped, spec.base_model)
            if error is not None:
                raise error
        raise InvalidTermsError(
            "nothing to add: every term is already a single token of the base tokenizer (or a "
            "duplicate); see the skipped list",
            param="terms",
        )
    report = extended.to_json()  # per term and per token: big, so events get the counts
    callbacks.on_event("extension", {"counts": report["counts"], "skipped": report["skipped"][:100]})

    stages.enter("init")
    method = init_method(spec.init, spec.steps, corpus=spec.corpus_path is not None)
    initial_rows = RowInitializer(model, tokenizer, row_method(method))
    if initial_rows.fallback_reason:
        callbacks.on_warning(f"init: {initial_rows.fallback_reason}")
    rows = initial_rows(model, extended)

    trained = None
    if spec.steps > 0 and spec.corpus_path is None:
        # Terms only: the base model first writes contexts for every term (minutes on a CPU),
        # a stage of its own so a job never sits at "train 0/N" meanwhile.
        stages.enter("generate")
        objective = build_training_data(spec, model, extended, callbacks)
        stages.enter("train")
    else:
        stages.enter("train")
        objective = build_training_data(spec, model, extended, callbacks) if spec.steps > 0 else None
    validation, selection = _validation_text(spec, model, tokenizer, objective, callbacks)
    init_report = initial_rows.report()
    if objective is not None and method == "distill":
        rows, init_report["distillation"] = _distill_inputs(spec, model, extended, rows, objective, callbacks)
    if objective is not None:
        trained = _train(spec, model, extended, rows, objective, callbacks, validation=validation, init=method)
        rows = trained.rows
        selection.update(_step_report(trained, validation))
    vocabulary = NewVocabulary(extended=extended, rows=rows, trained=trained, mined=mined, selection=selection,
                               optimizer_state=trained.optimizer_state if trained else None, init=init_report)
    if validation is not None:
        _choose_terms(spec, model, tokenizer, vocabulary, validation, callbacks, initial_rows)
    callbacks.on_event("selection", {k: v for k, v in selection.items() if k not in ("effects", "validation_curve")})
    return vocabulary


def _validation_text(spec: ExtendSpec, model, tokenizer, objective, callbacks: Callbacks):
    """(ValidationSet or None, the selection report so far). Scored by the plain base model."""
    from .selection import build_validation
    from .selection.plan import MIN_VALIDATION_BYTES

    if spec.selection == "none":
        return None, {"mode": "none"}
    if spec.corpus_path is not None:
        documents = list(corpus_io.split_documents(spec.corpus_path, "validation", text_field=spec.corpus_text_field,
                                                   label=corpus_label(spec)))
        source = "corpus validation split"
    else:
        documents = list(getattr(objective, "validation_texts", []))
        source = "held-out generated contexts"
    # Generated contexts: one per term, however short, is a guard worth having (it decides only
    # the step, never which terms stay); a corpus's validation text must be big enough to decide on.
    minimum = MIN_VALIDATION_BYTES if spec.corpus_path is not None else 1
    validation = build_validation(model, tokenizer, documents, source=source, min_bytes=minimum) if documents else None
    if validation is None:
        size = sum(len(d.encode("utf-8")) for d in documents)
        skipped = (f"the {source} holds {size:,} bytes, under the {MIN_VALIDATION_BYTES:,} needed to decide on; "
                   "the last training step and every term are published" + (
                       " (give a larger corpus: about 5% of documents, chosen by hash, are validation)" if spec.corpus_path else ""))
        if spec.corpus_path is not None or spec.steps > 0:
            callbacks.on_warning(f"no validation: {skipped}")
        return None, {"mode": spec.selection, "skipped": skipped}
    return validation, {"mode": spec.selection, "validation": validation.report()}


def _step_report(trained, validation) -> dict:
    if validation is None or trained.best_step is None:
        return {}
    share = trained.seconds["validation"] / trained.seconds["training"] if trained.seconds.get("training") else None
    return {"best_step": trained.best_step, "validation_curve": trained.validation,
            "step_validation_bits_per_byte_base": validation.base_bits_per_byte(validation.step_chunks),
            "seconds": trained.seconds, "validation_share": share}


def _choose_terms(spec: ExtendSpec, model, tokenizer, vocabulary: NewVocabulary, validation, callbacks: Callbacks,
                  initial_rows) -> None:
    """Corpus jobs: drop the terms that do not pay (selection.terms). Terms-only jobs keep the
    user's terms and report each one's measured effect on its held-out contexts."""
    from .selection.plan import MAX_SELECTION_ROUNDS
    from .selection.terms import keep_optimizer_rows, measure_terms, merges_rebuilder, select_terms, term_units, terms_rebuilder, token_units

    extended = vocabulary.extended
    units = token_units(extended) if vocabulary.mined is not None else term_units(extended)
    if spec.corpus_path is None:
        vocabulary.selection.update(measure_terms(model, extended, vocabulary.rows, validation, units=units,
                                                  pad_to_multiple_of=spec.pad_to_multiple_of))
        return
    rows = embedding_rows(model)
    rebuild = (merges_rebuilder(tokenizer, vocabulary.mined.merges, embedding_rows=rows) if vocabulary.mined is not None
               else terms_rebuilder(tokenizer, max_term_chars=spec.max_term_chars, embedding_rows=rows))
    started = time.perf_counter()
    chosen = select_terms(model, extended, vocabulary.rows, validation, units=units, rebuild=rebuild,
                          pad_to_multiple_of=spec.pad_to_multiple_of, should_cancel=callbacks.should_cancel,
                          initial_rows=initial_rows)
    vocabulary.selection.update(chosen.to_json(), terms_seconds=round(time.perf_counter() - started, 3))
    if chosen.extended is None:
        last = chosen.rounds[-1]
        # The job fails below; its events still say what each round scored and removed.
        callbacks.on_event("selection", {k: v for k, v in vocabulary.selection.items() if k not in ("effects", "validation_curve")})
        raise InvalidCorpusError(
            f"no new token paid for itself on the corpus's validation split: with {chosen.rounds[0]['new_tokens']} new "
            f"tokens the model scored {chosen.rounds[0]['bits_per_byte']:.4f} bits per byte on the half of it that judges "
            "(the other half decides which tokens go) against the base "
            f"model's {last['base_bits_per_byte']:.4f}, and removing the tokens that cost more than they save "
            f"({len(chosen.rounds)} of at most {MAX_SELECTION_ROUNDS} rounds, last scored {last['bits_per_byte']:.4f}) "
            "left none; nothing was published. Train longer (steps), give more text, or publish every term anyway "
            "with selection 'none' (--keep-all-terms)",
            param="corpus",
        )
    for entry in chosen.removed:
        callbacks.on_warning(f"term {entry['term']!r} removed: {entry['reason']}")
    vocabulary.optimizer_state = keep_optimizer_rows(vocabulary.optimizer_state, chosen.kept_index, len(extended.new_tokens))
    vocabulary.extended, vocabulary.rows = chosen.extended, chosen.rows


def embedding_rows(model) -> int:
    """The base model's embedding rows: new ids start after them (and after every id in use)."""
    return model.get_input_embeddings().weight.shape[0]


def _extend(spec: ExtendSpec, tokenizer, callbacks: Callbacks, *, embedding_rows: int):
    from .tokenizer import extend_tokenizer

    extended = extend_tokenizer(tokenizer, spec.terms or [], max_term_chars=spec.max_term_chars, embedding_rows=embedding_rows)
    for skipped in extended.skipped:
        callbacks.on_warning(f"term {skipped.term!r} skipped: {skipped.detail}")
    return extended


def _mine(spec: ExtendSpec, tokenizer, callbacks: Callbacks, documents: int, *, embedding_rows: int):
    from .mining import mine_terms

    total = 2 * documents  # the two passes over the corpus: counting words, checking encodings
    mined = mine_terms(
        tokenizer, spec.corpus_path, max_new_tokens=spec.max_new_tokens,
        min_frequency=spec.min_frequency, mining_unit=spec.mining_unit, text_field=spec.corpus_text_field,
        should_cancel=callbacks.should_cancel, corpus_name=spec.corpus_name or "corpus",
        on_progress=(lambda read: callbacks.on_progress(min(read, total - 1), total, {"unit": "documents"})) if total else None,
        embedding_rows=embedding_rows,
    )
    callbacks.on_event("mined_terms", mined.report)
    if mined.report.get("status") == "guarantee_failed" or not mined.found_terms:
        raise InvalidCorpusError(mined.report.get("message") or "mining found no term worth adding", param="corpus")
    return mined


def _train(spec: ExtendSpec, model, extended, rows, objective, callbacks: Callbacks, *, validation=None, init: str | None = None):
    """Train the new rows on `objective` (built from the plain base model, before attaching), on
    the frozen model itself, on its device (a bf16 base on a GPU; the new rows are fp32),
    keeping the best step on `validation` when there is one."""
    from .rows.adapter import attach
    from .selection import StepScorer, ValidationPlan
    from .training.identity import run_identity
    from .training.loop import TrainConfig, train_rows

    # The rows' start (init method) is part of the run: another start never resumes these rows.
    identity = {**run_identity(model, extended), "init": init}
    config = TrainConfig.from_spec(spec)
    validate = None
    if validation is not None:
        plan = ValidationPlan.for_training(steps=config.steps, batch_size=config.batch_size, seq_len=config.seq_len,
                                           available_tokens=validation.base.tokens)
        validate = StepScorer(validation, extended, plan)
    adapter = attach(model, extended.base_vocab_size, rows, pad_to_multiple_of=spec.pad_to_multiple_of)
    try:
        return train_rows(model, adapter, objective, config, callbacks, identity=identity, validate=validate)
    finally:
        adapter.detach()


def _distill_inputs(spec: ExtendSpec, model, extended, rows, objective, callbacks: Callbacks):
    """(rows with the input side distilled on the job's own contexts, the report): init 'distill'.
    Kept in the work folder (input_distillation.DISTILLED_NAME): a resumed job, whose training
    checkpoint needs these rows' run, does not distil again (minutes on a CPU)."""
    from .training.identity import run_identity
    from .training.input_distillation import contexts_of, distill_input_rows, load_distilled, save_distilled
    from .rows.adapter import attach

    key = {**run_identity(model, extended), "data": objective.fingerprint() if hasattr(objective, "fingerprint") else None,
           "distill_contexts": spec.distill_contexts, "lr": spec.lr * spec.embedding_lr_multiplier, "seed": spec.seed}
    kept = load_distilled(callbacks.work_dir, key)
    if kept is not None:
        rows, report = kept[0], {**kept[1], "resumed": True}
        callbacks.on_event("input_distillation", report)
        return rows, report
    contexts = contexts_of(objective, extended.base_vocab_size, per_token=spec.distill_contexts, seed=spec.seed)
    pad = extended.tokenizer.pad_token_id if extended.tokenizer.pad_token_id is not None else (extended.tokenizer.eos_token_id or 0)
    adapter = attach(model, extended.base_vocab_size, rows, pad_to_multiple_of=spec.pad_to_multiple_of)
    try:
        report = distill_input_rows(
            adapter, contexts, {t.id: t.base_ids for t in extended.new_tokens}, lr=spec.lr * spec.embedding_lr_multiplier,
            pad=pad, seed=spec.seed, should_cancel=callbacks.should_cancel,
            on_progress=lambda done, total: callbacks.on_progress(done, total, {"unit": "distillation steps"}))
        distilled = adapter.rows()
    finally:
        adapter.detach()
    callbacks.on_event("input_distillation", report.to_json())
    save_distilled(callbacks.work_dir, key, distilled, report.to_json())
    return distilled, report.to_json()


def _publishable(model, plan: JobPlan, sources: ModelSources, rows, base_vocab_size: int):
    """The model to publish: `model` when its weights are the checkpoint's own (same dtype, none
    offloaded), else the checkpoint loaded on the CPU in its dtype with `rows` applied."""
    from .plan.devices import offloaded, release_cached_memory, model_device
    from .rows.init import apply_rows

    if model.get_input_embeddings().weight.dtype == plan.stored_dtype and not offloaded(model):
        return model
    release_cached_memory(model_device(model))
    copy = load_model(plan.resolved, sources).eval()  # CPU, dtype "auto": the checkpoint's own
    apply_rows(copy, rows, base_vocab_size=base_vocab_size, pad_to_multiple_of=plan.spec.pad_to_multiple_of)
    return copy


def _held_out_docs(plan: JobPlan) -> list[str]:
    """The test split: what the job reports on, which no decision saw."""
    spec = plan.spec
    if spec.corpus_path is None:
        return []
    return list(corpus_io.split_documents(spec.corpus_path, "test", text_field=spec.corpus_text_field, label=plan.corpus_label()))


def _calibration_ids(tokenizer, general) -> torch.Tensor | None:
    text = "\n\n".join(general.documents)[:4000] if general else ""
    if not text:
        return None
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[:, :512]
    return ids


def _embedding_module_name(model) -> str:
    embedding = model.get_input_embeddings()
    for name, module in model.named_modules():
        if module is embedding:
            return name.rsplit(".", 1)[-1]
    return "embed_tokens"
