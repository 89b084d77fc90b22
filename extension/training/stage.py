"""The generate and train stages of a job: the text the new rows learn from and are judged on,
then the rows trained on it with the base frozen.

generate: contexts the base model writes around each term (a terms-only job), or windows of the
corpus's training split; and the validation text that picks the best step and, later, the terms
(the corpus's validation split, or held-out generated contexts). A terms-only job's held-out
contexts come in two parts: one picks the step, the other (`judging`) decides nothing and is what
the job reports on. Scored once by the plain base model.
train: init 'distill' first distils the input rows on those texts (kept in the work folder so a
resumed job does not distil again), then train_rows, keeping the best step on the validation text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..plan import corpus as corpus_io
from ..plan.corpus import corpus_label
from ..plan.options import TERMS_ONLY_TRAINING_CONTEXTS
from ..plan.spec import Callbacks
from ..rows.adapter import attach
from ..rows.init import DISTILLED_STARTS, NewRows
from ..rows.stage import StartRows
from ..selection import StepScorer, ValidationPlan, ValidationSet, build_validation
from ..selection.plan import MIN_VALIDATION_BYTES
from .identity import run_identity
from .input_distillation import (EPOCHS, HELD_LOGITS_EPOCHS, HELD_LOGITS_PENALTY, contexts_of, distill_input_rows,
                                 load_distilled, save_distilled)
from .loop import TrainConfig, TrainResult, train_rows
from .objectives import build_training_data, untrained_judging_texts


@dataclass
class JobTexts:
    objective: Any | None  # what the rows train on (TokenWindows or TermContextObjective); None: no training
    validation: ValidationSet | None  # what decides the best step and the terms; None: nothing decides
    report: dict  # the selection report so far: its mode, and the validation text or why there is none
    # terms-only: held-out contexts apart from `validation` that no decision sees; the job's
    # reported before/after is measured on them (a corpus job reports on its test split instead)
    judging: ValidationSet | None = None


@dataclass
class Trained:
    rows: NewRows  # the rows to publish (the start rows when nothing trained)
    result: TrainResult | None = None  # history, steps done, best step, the rows' AdamW state
    distillation: dict | None = None  # init 'distill': what distilling the input rows did
    step_report: dict = field(default_factory=dict)  # the best step on the validation text, its curve

    @property
    def optimizer_state(self):
        return self.result.optimizer_state if self.result else None


def write_texts(spec, model, tokenizer, extended, callbacks: Callbacks, *, init: str) -> JobTexts:
    """The generate stage. Runs on the plain base model, before any rows are attached. `init`:
    the job's init method (rows.stage.StartRows.method); a distilling one needs contexts even
    where no step is trained."""
    if spec.corpus_path is None and spec.steps == 0 and (spec.selection != "none" or init in DISTILLED_STARTS):
        return _untrained_terms_texts(spec, model, tokenizer, extended, callbacks, distil=init in DISTILLED_STARTS)
    objective = build_training_data(spec, model, extended, callbacks) if spec.steps > 0 else None
    if spec.selection == "none":
        return JobTexts(objective, None, {"mode": "none"})
    if spec.corpus_path is not None:
        documents = list(corpus_io.split_documents(spec.corpus_path, "validation", text_field=spec.corpus_text_field,
                                                   label=corpus_label(spec)))
        source = "corpus validation split"
    else:
        documents = list(getattr(objective, "validation_texts", []))
        source = HELD_OUT_SOURCES[_plan_of(objective).get("deciding", "generated")]
    # Generated contexts: one per term, however short, is a guard worth having (it decides only
    # the step, never which terms stay); a corpus's validation text must be big enough to decide on.
    minimum = MIN_VALIDATION_BYTES if spec.corpus_path is not None else 1
    validation = build_validation(model, tokenizer, documents, source=source, min_bytes=minimum) if documents else None
    if validation is None and objective is None and spec.corpus_path is None:
        skipped = "no contexts were written (steps 0), so there is no held-out text to judge the terms on"
        return JobTexts(objective, None, {"mode": spec.selection, "skipped": skipped})
    if validation is None:
        size = sum(len(d.encode("utf-8")) for d in documents)
        skipped = (f"the {source} holds {size:,} bytes, under the {minimum:,} needed to decide on; "
                   "the last training step and every term are published" + (
                       " (give a larger corpus: about 5% of documents, chosen by hash, are validation)" if spec.corpus_path else ""))
        if spec.corpus_path is not None or spec.steps > 0:
            callbacks.on_warning(f"no validation: {skipped}")
        return JobTexts(objective, None, {"mode": spec.selection, "skipped": skipped})
    report = {"mode": spec.selection, "validation": validation.report()}
    if _plan_of(objective):
        report["contexts"] = _plan_of(objective)
    judging_texts = list(getattr(objective, "judging_texts", [])) if spec.corpus_path is None else []
    judging_source = HELD_OUT_SOURCES[_plan_of(objective).get("judging", "generated")] + ", judging part"
    judging = build_validation(model, tokenizer, judging_texts, source=judging_source, min_bytes=1) if judging_texts else None
    if judging is not None:
        report["judging"] = judging.report()
    return JobTexts(objective, validation, report, judging)


def _untrained_terms_texts(spec, model, tokenizer, extended, callbacks: Callbacks, *, distil: bool) -> JobTexts:
    """A terms-only job of 0 steps takes no training step and so decides nothing (no step to choose;
    every term stays), but it still reports its before/after on held-out text it never saw. With
    `distil` it also writes the contexts its input rows are distilled on (the judging part apart)."""
    objective = None
    if distil:
        objective = build_training_data(spec, model, extended, callbacks, distil_untrained=True)
        texts, kind = list(objective.judging_texts), _plan_of(objective).get("judging", "generated")
    elif spec.selection != "none":
        texts, kind = untrained_judging_texts(spec, model, extended, callbacks)
    else:
        texts, kind = [], "generated"
    source = HELD_OUT_SOURCES[kind] + ", judging part"
    judging = build_validation(model, tokenizer, texts, source=source, min_bytes=1) if texts else None
    done = ("its input rows were distilled on contexts the base model wrote, each row's logits held where the subword "
            "mean put them, and no next-token step was taken (steps 0)") if distil else "nothing was trained (steps 0)"
    written = {k: v for k, v in _plan_of(objective).items() if k != "deciding"}  # nothing decides at 0 steps
    report = {"mode": spec.selection, "contexts": {**written, "judging": kind}, "terms_kept_unjudged": (
        f"{done}, so no step and no term was chosen and every term is kept; by default a terms-only "
        f"job without examples trains only where it writes {TERMS_ONLY_TRAINING_CONTEXTS} or more contexts per term (a "
        "GPU's default, which then takes the steps that read them all), because training on fewer made the domain's own "
        "text worse than the untrained rows in TIDE's measurements")}
    if judging is not None:
        report["judging"] = judging.report()
    return JobTexts(objective, None, report, judging)


# Where a terms-only job's held-out text comes from (ContextPlan.to_json's "deciding" / "judging")
HELD_OUT_SOURCES = {"generated": "held-out generated contexts", "examples": "held-out documents of your examples"}


def _plan_of(objective) -> dict:
    return getattr(objective, "plan", None) or {}


def train_new_rows(spec, model, extended, start: StartRows, texts: JobTexts, callbacks: Callbacks) -> Trained:
    """The train stage: the new rows trained on `texts.objective` on the frozen model itself, on
    its device (a bf16 base on a GPU; the rows are fp32). Nothing to do without an objective."""
    if texts.objective is None:
        return Trained(rows=start.rows)
    rows, distillation = start.rows, None
    if start.method in DISTILLED_STARTS:
        rows, distillation = _distill_inputs(spec, model, extended, rows, texts.objective, callbacks, method=start.method)
    if spec.steps == 0:
        return Trained(rows=rows, distillation=distillation)
    # The rows' start (init method) is part of the run: another start never resumes these rows.
    identity = {**run_identity(model, extended), "init": start.method}
    config = TrainConfig.from_spec(spec)
    validate = None
    if texts.validation is not None:
        plan = ValidationPlan.for_training(steps=config.steps, batch_size=config.batch_size, seq_len=config.seq_len,
                                           available_tokens=texts.validation.base.tokens)
        validate = StepScorer(texts.validation, extended, plan)
    adapter = attach(model, extended.base_vocab_size, rows, pad_to_multiple_of=spec.pad_to_multiple_of)
    try:
        result = train_rows(model, adapter, texts.objective, config, callbacks, identity=identity, validate=validate)
    finally:
        adapter.detach()
    return Trained(rows=result.rows, result=result, distillation=distillation,
                   step_report=_step_report(result, texts.validation))


def _step_report(result: TrainResult, validation) -> dict:
    if validation is None or result.best_step is None:
        return {}
    share = result.seconds["validation"] / result.seconds["training"] if result.seconds.get("training") else None
    return {"best_step": result.best_step, "validation_curve": result.validation,
            "step_validation_bits_per_byte_base": validation.base_bits_per_byte(validation.step_chunks),
            "seconds": result.seconds, "validation_share": share}


def _distill_inputs(spec, model, extended, rows: NewRows, objective, callbacks: Callbacks, *,
                    method: str) -> tuple[NewRows, dict]:
    """(rows with the input side distilled on the job's own contexts, the report): init 'distill',
    or 'subword_mean_distill' with the logits held (HELD_LOGITS_PENALTY, HELD_LOGITS_EPOCHS).
    Kept in the work folder (input_distillation.DISTILLED_NAME): a resumed job, whose training
    checkpoint needs these rows' run, does not distil again (minutes on a CPU)."""
    held = method == "subword_mean_distill"
    penalty, epochs = (HELD_LOGITS_PENALTY, HELD_LOGITS_EPOCHS) if held else (0.0, EPOCHS)
    key = {**run_identity(model, extended), "data": objective.fingerprint() if hasattr(objective, "fingerprint") else None,
           "distill_contexts": spec.distill_contexts, "lr": spec.lr * spec.embedding_lr_multiplier, "seed": spec.seed,
           "init": method, "logit_penalty": penalty, "epochs": epochs}
    kept = load_distilled(callbacks.work_dir, key)
    if kept is not None:
        rows, report = kept[0], {**kept[1], "resumed": True}
        callbacks.on_event("input_distillation", report)
        return rows, report
    contexts = contexts_of(objective, extended.base_vocab_size, per_token=spec.distill_contexts, seed=spec.seed)
    tokenizer = extended.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    adapter = attach(model, extended.base_vocab_size, rows, pad_to_multiple_of=spec.pad_to_multiple_of)
    try:
        report = distill_input_rows(
            adapter, contexts, {t.id: t.base_ids for t in extended.new_tokens}, lr=spec.lr * spec.embedding_lr_multiplier,
            pad=pad, seed=spec.seed, epochs=epochs, logit_penalty=penalty, should_cancel=callbacks.should_cancel,
            on_progress=lambda done, total: callbacks.on_progress(done, total, {"unit": "distillation steps"}))
        distilled = adapter.rows()
    finally:
        adapter.detach()
    callbacks.on_event("input_distillation", report.to_json())
    save_distilled(callbacks.work_dir, key, distilled, report.to_json())
    return distilled, report.to_json()
