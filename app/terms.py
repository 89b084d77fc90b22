"""Term checks at submit time, so a bad term is a 422 naming it instead of a failed job.

The rules are extension.tokenizer.clean_terms' (the same ones the worker applies); this adds
the server's count limit and points `param` at the first bad entry."""

from __future__ import annotations

from extension.errors import InvalidTermsError, TideError
from extension.tokenizer import clean_terms, extend_tokenizer, nothing_to_add_error

from .errors import ApiError
from .settings import Settings


def validate_terms(terms: list[str], settings: Settings) -> None:
    if len(terms) > settings.max_terms:
        raise ApiError(
            422, "too_many_terms",
            f"terms lists {len(terms)} entries; this server accepts at most {settings.max_terms} per job — split them over several jobs",
            "terms",
        )
    try:
        clean_terms(terms, max_term_chars=settings.max_term_chars)
    except InvalidTermsError as exc:
        raise ApiError(422, exc.code, exc.message, _first_bad(terms, settings.max_term_chars) or exc.param) from None


def _first_bad(terms: list[str], max_term_chars: int) -> str | None:
    for index, term in enumerate(terms):
        try:
            clean_terms([term], max_term_chars=max_term_chars)
        except InvalidTermsError:
            return f"terms[{index}]"
    return None


def check_terms_add_something(terms: list[str], tokenizer, base_model: str, settings: Settings) -> None:
    """Refuse (422 naming terms[i]) a list of which the worker would add nothing: every term
    already one token of the base tokenizer (or otherwise skipped). Call after validate_terms.

    A term the base tokenizer splits into several pieces will almost always be added, so the
    exact check — extending the tokenizer, which takes about 2 s on a 262k vocabulary — runs
    only when every term is a single token on its own."""
    kept, _duplicates = clean_terms(terms, max_term_chars=settings.max_term_chars)
    backend = tokenizer.backend_tokenizer
    if any(len(backend.encode(term, add_special_tokens=False).ids) != 1 for term in kept):
        return
    try:
        extended = extend_tokenizer(tokenizer, kept, max_term_chars=settings.max_term_chars)
    except TideError:
        return  # the worker meets the same problem and reports it with the job
    if extended.new_tokens:
        return
    error = nothing_to_add_error(terms, extended.skipped, base_model)
    if error is not None:
        raise ApiError(422, error.code, error.message, error.param)


def check_reserved_ids(request, tokenizer, folder, settings: Settings) -> None:
    """new_ids 'reserved': refuse (422 naming new_ids) a job that needs more reserved tokens than the
    base tokenizer has free, or a tokenizer with none. The server has the tokenizer but not the
    config, so the ids only the config names are left to the worker, which checks again before
    loading weights; what is refused here the worker would refuse too. A terms job is counted by
    extending the tokenizer (about 2 s on a 262k vocabulary), as the worker counts it: a term's
    forms and intermediates cannot be known without."""
    from types import SimpleNamespace

    from extension.errors import InvalidOptionError
    from extension.plan.options import option_error_for
    from extension.tokenizer.reserved import check_reserved_job

    has_corpus = request.corpus_file_id is not None or request.corpus_text is not None
    spec = SimpleNamespace(new_ids=request.new_ids, base_model=request.base_model, terms=request.terms,
                           max_term_chars=settings.max_term_chars, corpus_path="corpus" if has_corpus else None,
                           max_new_tokens=request.mining.max_new_tokens)
    try:
        check_reserved_job(spec, tokenizer, None, model_folder=folder)
    except InvalidOptionError as exc:
        message, param = option_error_for(exc, style="api")
        raise ApiError(422, exc.code, message, param) from None
    except TideError:
        return  # a term problem: the checks before this one, or the worker, say what it is
