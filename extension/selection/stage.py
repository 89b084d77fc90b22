"""The select stage of a job: what it publishes, decided on the validation text.

Every job drops the terms that do not pay (terms.select_terms) on its deciding text: a corpus
job's validation split, a terms-only job's deciding held-out part (the examples' or generated
contexts, the part that also chose the best step). A terms-only job then reports each kept term's
measured effect on its judging part, which chose nothing. Without validation text nothing is
decided and everything trained is published (the report says why).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidCorpusError, InvalidTermsError
from ..plan.spec import Callbacks
from ..rows.init import NewRows
from .plan import MAX_SELECTION_ROUNDS, MIN_VALIDATION_BYTES
from .terms import keep_optimizer_rows, measure_terms, merges_rebuilder, select_terms, term_units, terms_rebuilder, token_units


# Which of the user's terms stay is decided on the user's own text only. On contexts the base model
# wrote, the decision rests on about one use per term, mostly the prompt's p(term | start of text):
# on a 100-word Spanish glossary it removed every term (the job failed), while every term kept is
# +0.77% untrained and +2.59% trained on the domain's test text for text 7.41% shorter
# (benchmarks/results/terms_only_es.md).
GENERATED_DO_NOT_DECIDE = ("every term is kept: which terms pay is decided only on your own text (give a few documents "
                           "as examples, or a corpus); contexts the base model wrote chose the best training step and "
                           "judge the result")


@dataclass
class Chosen:
    extended: Any  # tokenizer.ExtendedTokenizer holding only the kept terms
    rows: NewRows  # their rows
    optimizer_state: dict | None  # the kept rows' AdamW state (carried into a Trainer checkpoint)
    report: dict  # what tide_extension.json records as "selection"


def choose_terms(spec, model, tokenizer, extended, trained, texts, start, mined, callbacks: Callbacks) -> Chosen:
    """`trained` (training.stage.Trained) judged on `texts.validation`; `start` gives the rows of
    terms a rebuilt tokenizer cuts anew, `mined` the merges a corpus job's tokenizer is rebuilt from."""
    report = {**texts.report, **trained.step_report}
    chosen = Chosen(extended, trained.rows, trained.optimizer_state, report)
    judging = getattr(texts, "judging", None)
    if texts.validation is not None:
        _decide(spec, model, tokenizer, chosen, texts.validation, start.initializer, mined, callbacks, judging=judging)
    elif judging is not None and spec.corpus_path is None:  # an untrained terms-only job: measured, nothing decided
        chosen.report.update(measure_terms(model, chosen.extended, chosen.rows, judging, units=_units(chosen.extended, mined),
                                           pad_to_multiple_of=spec.pad_to_multiple_of))
    callbacks.on_event("selection", {k: v for k, v in report.items() if k not in ("effects", "validation_curve")})
    return chosen


def _decide(spec, model, tokenizer, chosen: Chosen, validation, initializer, mined, callbacks: Callbacks, *,
            judging=None) -> None:
    units = _units(chosen.extended, mined)
    terms_only = spec.corpus_path is None
    if terms_only and validation.bytes < MIN_VALIDATION_BYTES:
        chosen.report["terms_kept_unjudged"] = (
            f"the deciding held-out text holds {validation.bytes:,} bytes, under the {MIN_VALIDATION_BYTES:,} needed to "
            "decide which terms stay; every term is kept")
    elif terms_only and chosen.report.get("contexts", {}).get("deciding") == "generated":
        chosen.report["terms_kept_unjudged"] = GENERATED_DO_NOT_DECIDE
    else:
        _select(spec, model, tokenizer, chosen, validation, units, initializer, mined, callbacks)
    if terms_only and judging is not None:
        # the before/after a terms-only job reports: on the judging part, which chose nothing
        chosen.report.update(measure_terms(model, chosen.extended, chosen.rows, judging, units=_units(chosen.extended, mined),
                                           pad_to_multiple_of=spec.pad_to_multiple_of))


def _units(extended, mined) -> list:
    return token_units(extended) if mined is not None else term_units(extended)


def _select(spec, model, tokenizer, chosen: Chosen, validation, units, initializer, mined, callbacks: Callbacks) -> None:
    """Drop the terms (or mined tokens) that make the deciding text worse than the base model
    (terms.select_terms); fails the job when none pays, saying what to give instead."""
    extended = chosen.extended
    rows = model.get_input_embeddings().weight.shape[0]
    rebuild = (merges_rebuilder(tokenizer, mined.merges, embedding_rows=rows) if mined is not None
               else terms_rebuilder(tokenizer, max_term_chars=spec.max_term_chars, embedding_rows=rows))
    started = time.perf_counter()
    selection = select_terms(model, extended, chosen.rows, validation, units=units, rebuild=rebuild,
                             pad_to_multiple_of=spec.pad_to_multiple_of, should_cancel=callbacks.should_cancel,
                             initial_rows=initializer, restore_tolerance=spec.restore_tolerance)
    chosen.report.update(selection.to_json(), terms_seconds=round(time.perf_counter() - started, 3))
    if selection.extended is None and spec.corpus_path is None:
        first, last = selection.rounds[0], selection.rounds[-1]
        callbacks.on_event("selection", {k: v for k, v in chosen.report.items() if k not in ("effects", "validation_curve")})
        raise InvalidTermsError(
            f"no term paid for itself on the held-out contexts ({validation.source}): with all {len(extended.terms)} "
            f"terms the model scored {first['bits_per_byte']:.4f} bits per byte on the half that judges against the base "
            f"model's {last['base_bits_per_byte']:.4f}, and removing the terms that cost more than they save left none; "
            "nothing was published. Give a few documents of your own text (examples) or a corpus to train and judge "
            "the terms on, train longer (steps), or publish every term anyway with selection 'none' (--keep-all-terms)",
            param="terms",
        )
    if selection.extended is None:
        first, last = selection.rounds[0], selection.rounds[-1]
        # The job fails below; its events still say what each round scored and removed.
        callbacks.on_event("selection", {k: v for k, v in chosen.report.items() if k not in ("effects", "validation_curve")})
        raise InvalidCorpusError(
            f"no new token paid for itself on the corpus's validation split: with {first['new_tokens']} new "
            f"tokens the model scored {first['bits_per_byte']:.4f} bits per byte on the half of it that judges "
            "(the other half decides which tokens go) against the base "
            f"model's {last['base_bits_per_byte']:.4f}, and removing the tokens that cost more than they save "
            f"({len(selection.rounds)} of at most {MAX_SELECTION_ROUNDS} rounds, last scored {last['bits_per_byte']:.4f}) "
            "left none; nothing was published. Train longer (steps), give more text, or publish every term anyway "
            "with selection 'none' (--keep-all-terms)",
            param="corpus",
        )
    hint = "; give a corpus or examples of your text to keep it" if spec.corpus_path is None else ""
    for entry in selection.removed:
        callbacks.on_warning(f"term {entry['term']!r} removed: {entry['reason']}{hint}")
    chosen.optimizer_state = keep_optimizer_rows(chosen.optimizer_state, selection.kept_index, len(extended.new_tokens))
    chosen.extended, chosen.rows = selection.extended, selection.rows
