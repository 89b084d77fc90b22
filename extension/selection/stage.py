"""The select stage of a job: what it publishes, decided on the validation text.

Corpus jobs drop the terms that do not pay (terms.select_terms); terms-only jobs keep the user's
terms and report each one's measured effect on the judging part of their held-out contexts (the
part that chose nothing: the other part chose the best step). Without validation text
nothing is decided and everything trained is published (the report says why).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidCorpusError
from ..plan.spec import Callbacks
from ..rows.init import NewRows
from .plan import MAX_SELECTION_ROUNDS
from .terms import keep_optimizer_rows, measure_terms, merges_rebuilder, select_terms, term_units, terms_rebuilder, token_units


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
    if texts.validation is not None:
        _decide(spec, model, tokenizer, chosen, texts.validation, start.initializer, mined, callbacks,
                judging=getattr(texts, "judging", None))
    callbacks.on_event("selection", {k: v for k, v in report.items() if k not in ("effects", "validation_curve")})
    return chosen


def _decide(spec, model, tokenizer, chosen: Chosen, validation, initializer, mined, callbacks: Callbacks, *,
            judging=None) -> None:
    extended = chosen.extended
    units = token_units(extended) if mined is not None else term_units(extended)
    if spec.corpus_path is None:
        # measured on the judging contexts only: `validation` chose the step, so it would flatter the rows
        if judging is not None:
            chosen.report.update(measure_terms(model, extended, chosen.rows, judging, units=units,
                                               pad_to_multiple_of=spec.pad_to_multiple_of))
        return
    rows = model.get_input_embeddings().weight.shape[0]
    rebuild = (merges_rebuilder(tokenizer, mined.merges, embedding_rows=rows) if mined is not None
               else terms_rebuilder(tokenizer, max_term_chars=spec.max_term_chars, embedding_rows=rows))
    started = time.perf_counter()
    selection = select_terms(model, extended, chosen.rows, validation, units=units, rebuild=rebuild,
                             pad_to_multiple_of=spec.pad_to_multiple_of, should_cancel=callbacks.should_cancel,
                             initial_rows=initializer)
    chosen.report.update(selection.to_json(), terms_seconds=round(time.perf_counter() - started, 3))
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
    for entry in selection.removed:
        callbacks.on_warning(f"term {entry['term']!r} removed: {entry['reason']}")
    chosen.optimizer_state = keep_optimizer_rows(chosen.optimizer_state, selection.kept_index, len(extended.new_tokens))
    chosen.extended, chosen.rows = selection.extended, selection.rows
