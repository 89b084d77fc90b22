"""The extend stage of a job: the user's terms into the tokenizer, or nothing to add said plainly."""

from __future__ import annotations

from ..errors import InvalidTermsError
from ..plan.spec import Callbacks
from .extend import extend_tokenizer
from .results import ExtendedTokenizer
from .terms import nothing_to_add_error


def extend_with_terms(spec, tokenizer, callbacks: Callbacks, *, embedding_rows: int) -> ExtendedTokenizer:
    """The base tokenizer extended with `spec.terms`; each skipped term is a warning. A job with
    nothing to add fails here, with the error the API gives at submit time when it can check."""
    extended = extend_tokenizer(tokenizer, spec.terms or [], max_term_chars=spec.max_term_chars, embedding_rows=embedding_rows)
    for skipped in extended.skipped:
        callbacks.on_warning(f"term {skipped.term!r} skipped: {skipped.detail}")
    if not extended.new_tokens:
        error = nothing_to_add_error(spec.terms or [], extended.skipped, spec.base_model)
        raise error or InvalidTermsError(
            "nothing to add: every term is already a single token of the base tokenizer (or a "
            "duplicate); see the skipped list",
            param="terms",
        )
    announce_extension(extended, callbacks)
    return extended


def announce_extension(extended: ExtendedTokenizer, callbacks: Callbacks) -> None:
    """The job's `extension` event: the counts and the first skipped terms (the per-token report
    is big and goes to tide_extension.json)."""
    report = extended.to_json()
    callbacks.on_event("extension", {"counts": report["counts"], "skipped": report["skipped"][:100]})


def take_reserved_ids(extended: ExtendedTokenizer, free, spec, callbacks: Callbacks) -> ExtendedTokenizer:
    """new_ids 'reserved': the chosen new tokens moved onto free reserved ids (onto_reserved.py),
    announced as the job's `reserved_tokens` event."""
    from .onto_reserved import onto_reserved

    moved = onto_reserved(extended, free, base_model=spec.base_model)
    callbacks.on_event("reserved_tokens", {"taken": len(moved.reserved), "free": len(free), "tokens": moved.reserved[:100]})
    return moved
