"""The validation text of a job, scored once by the base model, then once per candidate.

Corpus jobs: the corpus's validation split (extension.plan.corpus.split_of). Terms-only jobs: the
held-out share of the contexts the base model wrote for the terms (extension.training.term_contexts); the base
model wrote that text, so it is a guard (training must not make it worse than the init), not a
test of the terms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..evaluation.scoring import DEFAULT_CHUNK_BYTES, chunk_documents, context_token_id, document_cap
from .plan import MIN_VALIDATION_BYTES, SELECTION_MAX_BYTES, ValidationPlan
from .scoring import TextScore, score_text


@dataclass
class ValidationSet:
    source: str  # "corpus validation split" | "held-out generated contexts"
    chunks: list[str]  # every validation chunk (term selection reads them all)
    context_id: int
    base: TextScore  # the base model with the base tokenizer, on every chunk
    step_chunks: int = 0  # the first chunks, within the training budget, that step selection reads
    base_seconds: float = 0.0  # scoring the base model once (step and term scoring are timed by their callers)

    @property
    def bytes(self) -> int:
        return self.base.bytes

    def base_bits_per_byte(self, chunks: int | None = None) -> float:
        if chunks is None:
            return self.base.bits_per_byte
        part = self.base.chunks[:chunks]
        size = sum(len(text.encode("utf-8")) for text in self.chunks[:chunks])
        return TextScore(part, size).bits_per_byte

    def score(self, model, extended, *, chunks: int | None = None, leak: bool = False,
              fold: list[int] | None = None) -> TextScore:
        """Score the model as it is now (new rows attached) reading `extended`'s tokenizer: the
        first `chunks` chunks, or the chunks at the indices `fold` (see `folds`)."""
        texts = [self.chunks[i] for i in fold] if fold is not None else self.chunks[: chunks or len(self.chunks)]
        return score_text(
            model, extended.tokenizer, texts, context_id=self.context_id,
            first_new_id=extended.base_vocab_size if leak else None, num_new=len(extended.new_tokens) if leak else 0,
        )

    def folds(self) -> tuple[list[int], list[int]]:
        """(decide, judge): every other chunk. Term selection decides which terms go on one fold
        and judges whether the result beats the base on the other: judged on the text it chose
        on, a selection looks better than it is (the terms kept include those that were lucky
        there), which on FOLDOC showed as -0.38% on validation and +0.97% on the test split."""
        indices = range(len(self.chunks))
        return [i for i in indices if i % 2 == 0], [i for i in indices if i % 2 == 1]

    def base_fold(self, fold: list[int]) -> TextScore:
        """The base model's scores on the chunks of `fold`."""
        return TextScore([self.base.chunks[i] for i in fold], sum(len(self.chunks[i].encode("utf-8")) for i in fold))

    def report(self) -> dict:
        return {"source": self.source, "bytes": self.bytes, "chunks": len(self.chunks),
                "base_bits_per_byte": self.base.bits_per_byte, "base_tokens_per_byte": self.base.tokens / self.bytes,
                "base_seconds": round(self.base_seconds, 3)}


def build_validation(model, base_tokenizer, documents: list[str], *, source: str,
                     max_bytes: int = SELECTION_MAX_BYTES, min_bytes: int = MIN_VALIDATION_BYTES) -> ValidationSet | None:
    """Chunk and base-score the validation documents (call with the plain base model, before any
    rows are attached). None when there is less than `min_bytes` of text to decide on.

    Each document gives at most its share of `max_bytes` (evaluate.document_cap): the decisions
    then rest on several documents even where a few long ones would fill the text."""
    per_document = document_cap([len(doc.encode("utf-8")) for doc in documents], max_bytes)
    chunks = [chunk for doc in chunk_documents(documents, DEFAULT_CHUNK_BYTES, max_bytes, per_document) for chunk in doc]
    if not chunks or sum(len(chunk.encode("utf-8")) for chunk in chunks) < min_bytes:
        return None

    started = time.perf_counter()
    context = context_token_id(base_tokenizer)
    base = score_text(model, base_tokenizer, chunks, context_id=context)
    validation = ValidationSet(source=source, chunks=chunks, context_id=context, base=base, step_chunks=len(chunks))
    validation.base_seconds = time.perf_counter() - started
    return validation


def chunks_within(score: TextScore, tokens: int) -> int:
    """How many leading chunks of `score` hold at most `tokens` tokens (at least one: never more,
    so long chunks cannot push step scoring past its budget)."""
    total = 0
    for count, chunk in enumerate(score.chunks, start=1):
        total += len(chunk.ids)
        if total > tokens:
            return max(1, count - 1)
    return len(score.chunks)


@dataclass
class StepScorer:
    """train.StepValidation over a ValidationSet: the first `chunks` chunks, at the plan's steps."""

    validation: ValidationSet
    extended: object  # the ExtendedTokenizer the rows belong to
    plan: ValidationPlan

    def __post_init__(self):
        self.validation.step_chunks = chunks_within(self.validation.base, self.plan.tokens_per_eval)

    def due(self, step: int) -> bool:
        return self.plan.due(step)

    def __call__(self, adapter) -> float:
        return self.validation.score(adapter.model, self.extended, chunks=self.validation.step_chunks).bits_per_byte
