"""The training data of a job: corpus windows when it has a corpus, else contexts the base model
writes for the terms. One place that knows both objectives, so neither the training loop
(extension/training/loop.py) nor the terms objective (extension/training/term_contexts.py) imports the other."""

from __future__ import annotations

from . import term_contexts as distill
from ..plan.spec import Callbacks
from .loop import DEFAULT_SAMPLING, TrainConfig, corpus_windows, max_positions

DEFAULT_TERMS_OBJECTIVE = "distill"


def build_training_data(spec, model, extended, callbacks: Callbacks | None = None, *,
                        sampling: str = DEFAULT_SAMPLING, terms_objective: str = DEFAULT_TERMS_OBJECTIVE,
                        distil_untrained: bool = False):
    """The objective of a job: corpus windows when there is a corpus, else contexts generated
    by the base model for the terms. Call BEFORE attaching the adapter (generation uses the
    plain base model). Validates the training options against the model.
    `distil_untrained`: a terms-only job of 0 steps whose input rows are distilled (init
    'subword_mean_distill'): `term_contexts` per term for the distillation, and only the judging
    part held out, since nothing is decided."""
    callbacks = callbacks or Callbacks()
    config = TrainConfig.from_spec(spec).validate(max_positions=max_positions(model))
    if spec.corpus_path is not None:
        return corpus_windows(spec.corpus_path, extended.tokenizer, base_vocab_size=extended.base_vocab_size,
                              config=config, sampling=sampling, text_field=spec.corpus_text_field)
    return distill.terms_objective(
        model, extended, config, objective=terms_objective, per_term=spec.term_contexts,
        max_new_tokens=spec.term_context_tokens, style=spec.term_prompts, examples=spec.examples,
        distilled_per_term=spec.term_contexts if distil_untrained else spec.distill_contexts if spec.init == "distill" else 0,
        work_dir=callbacks.work_dir, should_cancel=callbacks.should_cancel,
        hold_out=getattr(spec, "selection", "none") == "validation", with_deciding=not distil_untrained,
        on_progress=lambda done, total: callbacks.on_progress(done, total, {"unit": "contexts"}))


def untrained_judging_texts(spec, model, extended, callbacks: Callbacks | None = None) -> tuple[list[str], str]:
    """A terms-only job of 0 steps: the held-out text its before/after is measured on
    (term_contexts.judging_texts). Call before attaching the adapter."""
    callbacks = callbacks or Callbacks()
    config = TrainConfig.from_spec(spec)
    return distill.judging_texts(
        model, extended, config, max_new_tokens=spec.term_context_tokens, style=spec.term_prompts, examples=spec.examples,
        work_dir=callbacks.work_dir, should_cancel=callbacks.should_cancel,
        on_progress=lambda done, total: callbacks.on_progress(done, total, {"unit": "contexts"}))
