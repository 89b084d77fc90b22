"""Term checks at submit time, so a bad term is a 422 naming it instead of a failed job."""

from __future__ import annotations

import unicodedata

from .errors import ApiError
from .settings import Settings


def validate_terms(terms: list[str], settings: Settings) -> None:
    if not terms:
        raise ApiError(422, "invalid_terms", "terms is an empty list; list at least one word, or leave terms out and give a corpus", "terms")
    if len(terms) > settings.max_terms:
        raise ApiError(
            422, "too_many_terms",
            f"terms lists {len(terms)} entries; this server accepts at most {settings.max_terms} per job — split them over several jobs",
            "terms",
        )
    for index, term in enumerate(terms):
        param = f"terms[{index}]"
        if not term.strip():
            raise ApiError(422, "invalid_terms", f"{param} is empty or only whitespace; remove it", param)
        if len(term) > settings.max_term_chars:
            raise ApiError(422, "invalid_terms", f"{param} has {len(term)} characters; the limit is {settings.max_term_chars}", param)
        bad = next((c for c in term if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn")), None)
        if bad is not None:
            raise ApiError(422, "invalid_terms", f"{param} contains the control character U+{ord(bad):04X}; remove it", param)
