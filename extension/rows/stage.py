"""The init stage of a job: every new row's start, from the term's ORIGINAL pieces."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.spec import Callbacks
from .init import NewRows, RowInitializer, init_method, row_method


@dataclass
class StartRows:
    rows: NewRows
    method: str  # the job's init: composition, subword_mean, subword_mean_norm, distill or subword_mean_distill
    initializer: RowInitializer  # selection starts the rows of re-cut terms with the same one
    report: dict  # what tide_extension.json records as "init"


def start_rows(spec, model, tokenizer, extended, callbacks: Callbacks) -> StartRows:
    """The rows each new token starts from ('distill' starts from composed rows; the train stage
    distils their input side)."""
    method = init_method(spec.init, spec.steps, corpus=spec.corpus_path is not None)
    initializer = RowInitializer(model, tokenizer, row_method(method))
    if initializer.fallback_reason:
        callbacks.on_warning(f"init: {initializer.fallback_reason}")
    rows = initializer(model, extended)
    report = initializer.report()
    if method != report["method"]:  # 'distill', 'subword_mean_distill': the train stage distils this start's input side
        report = {**report, "method": method, "starts_from": report["method"]}
    return StartRows(rows=rows, method=method, initializer=initializer, report=report)
