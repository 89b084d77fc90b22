"""The mine stage of a job: the corpus's best new tokens, appended to the tokenizer as merges."""

from __future__ import annotations

from ..errors import InvalidCorpusError
from ..plan.spec import Callbacks
from ..tokenizer.stage import announce_extension
from .miner import mine_terms
from .result import MiningResult


def mine_corpus(spec, tokenizer, callbacks: Callbacks, *, documents: int, embedding_rows: int) -> MiningResult:
    """Mine `spec.corpus_path` with the job's options; progress counts the two passes over its
    `documents` (counting words, checking encodings). A corpus with nothing worth adding fails here."""
    total = 2 * documents
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
    announce_extension(mined.extended, callbacks)
    return mined
