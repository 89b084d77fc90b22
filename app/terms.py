"""Term checks at submit time, so a bad term is a 422 naming it instead of a failed job.

The rules are extension.tokenizer.clean_terms' (the same ones the worker applies); this adds
the server's count limit and points `param` at the first bad entry."""

from __future__ import annotations

from extension.errors import InvalidTermsError
from extension.tokenizer import clean_terms

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
