"""A terms-only job's `examples`: a few documents of the user's own text beside the list.

Real text around a term beats text the base model writes for it (Token Distillation, arXiv
2505.20133, finds retrieved snippets slightly better than generated ones), and only the user's
text can tell whether the published model is as good as its base on that text. So the documents
are split three ways by position (split_examples): most give training snippets around each term
(snippets_around), and where there are enough documents one part decides (the best step, which
terms stay) and one part judges (the job's reported before/after, which no decision saw).
Generated contexts fill whatever the examples cannot.
"""

from __future__ import annotations

from .term_prompts import writing_system

BEFORE_CHARS = 160  # text kept before a term: the term sits mid-text, as in the user's documents
SNIPPET_CHARS = 600  # about 128 tokens of English; the objective cuts to seq_len tokens anyway


def split_examples(documents: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(training, deciding, judging) documents: every fifth from the second judges, every fifth
    from the fourth decides, the rest train. With one document it only trains; with two or three,
    one judges and the job decides on generated contexts."""
    judging = [doc for index, doc in enumerate(documents) if index % 5 == 1]
    deciding = [doc for index, doc in enumerate(documents) if index % 5 == 3]
    training = [doc for index, doc in enumerate(documents) if index % 5 not in (1, 3)]
    return training, deciding, judging


def snippets_around(term: str, documents: list[str], *, limit: int) -> list[str]:
    """Up to `limit` pieces of `documents` that hold `term`, each from up to BEFORE_CHARS before
    it to SNIPPET_CHARS in all, cut at spaces where the script has them; occurrences are taken
    one per document in turn, so the snippets spread over the documents."""
    spaced = writing_system(term) == "spaced"
    per_document = [_occurrences(term, doc) for doc in documents]
    snippets: list[str] = []
    round_ = 0
    while len(snippets) < limit and any(round_ < len(found) for found in per_document):
        for doc, found in zip(documents, per_document):
            if round_ < len(found) and len(snippets) < limit:
                snippets.append(_cut(doc, found[round_], len(term), spaced))
        round_ += 1
    return snippets


def _occurrences(term: str, text: str) -> list[int]:
    found, start = [], text.find(term)
    while start >= 0:
        found.append(start)
        start = text.find(term, start + len(term) + SNIPPET_CHARS - BEFORE_CHARS)  # snippets never overlap
    return found


def _cut(text: str, at: int, length: int, spaced: bool) -> str:
    start = max(0, at - BEFORE_CHARS)
    end = min(len(text), max(at + length, start + SNIPPET_CHARS))
    if spaced:
        if start > 0:
            space = text.find(" ", start, at)
            start = space + 1 if space >= 0 else start
        if end < len(text):
            space = text.rfind(" ", at + length, end)
            end = space if space >= 0 else end
    return text[start:end].strip()
