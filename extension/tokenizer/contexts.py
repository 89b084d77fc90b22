"""The natural contexts a term must be ONE token in, checked twice: on the base tokenizer before
planning (a base token that straddles the term's edge rules merges out), and on every built
tokenizer (each term is one token in every context, and added tokens decode back to their text).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base_view import BaseView
    from .merge_plan import Candidate
    from .tokenizer_json import NewVocab

# "{}" is the term. Contexts that start with the term exercise the start-of-text form, the others
# the after-a-space form.
START_CONTEXTS = ("{}", "{} is", "{}.", "{}, and", "{}\n")
SPACE_CONTEXTS = ("a {}", "the {} is", "See {}.", "a {}, b", "a {}\n", "(a {})")


def _term_spans(term: str) -> list[tuple[str, int, int]]:
    """(context text, start, end) of the term's form in every context; the after-a-space form
    includes its space."""
    spans = []
    for template in START_CONTEXTS:
        spans.append((template.format(term), 0, len(term)))
    for template in SPACE_CONTEXTS:
        at = template.index("{}") - 1
        spans.append((template.format(term), at, at + 1 + len(term)))
    return spans


def joined_with_context(view: BaseView, terms: list[str]) -> dict[str, str]:
    """Terms that the BASE tokenizer already fuses with neighbouring text in some context (a base
    token straddles the term's edge, as Gemma's "++." does): merges appended after the base ones
    can never give those a token of their own. Checked up front so the build is usually right
    the first time."""
    jobs = [(term, text, start, end) for term in terms for text, start, end in _term_spans(term)]
    if not jobs:
        return {}
    encodings = view.backend.encode_batch([text for _, text, _, _ in jobs], add_special_tokens=False)
    joined: dict[str, str] = {}
    for (term, text, start, end), encoding in zip(jobs, encodings):
        if term in joined:
            continue
        for at, (low, high) in enumerate(encoding.offsets):
            if low < start < high or low < end < high:
                token = encoding.tokens[at]
                joined[term] = f"the base tokenizer joins it with the text around it: in {text!r} it makes {token!r}"
                break
    return joined


def _expected_ids(term: str, start_id: int, space_id: int) -> list[tuple[str, int]]:
    return [(c.format(term), start_id) for c in START_CONTEXTS] + [(c.format(term), space_id) for c in SPACE_CONTEXTS]


def terms_failing_in_context(
    backend, new_vocab: NewVocab, view: BaseView, candidates: dict[str, Candidate]
) -> dict[str, str]:
    """Encode every term in its natural contexts with `backend`; term -> why it failed (first failure)."""
    checks: list[tuple[str, str, int]] = []
    for term, forms in new_vocab.plan.term_forms.items():
        form_ids = {text: new_vocab.merge_token_ids[bpe_string] for text, bpe_string in forms.items()}
        form_ids.update(candidates[term].existing)
        # The start form's text is the term itself; a tokenizer with one form uses it after spaces too.
        start_id = form_ids[term]
        space_id = form_ids.get(" " + term, start_id)
        checks.extend((term, text, token_id) for text, token_id in _expected_ids(term, start_id, space_id))
    for term in new_vocab.added_terms:
        forms = new_vocab.added_forms(term)
        checks.extend((term, text, token_id) for text, token_id in _expected_ids(term, forms[term], forms.get(" " + term, forms[term])))
    if not checks:
        return {}
    texts = [text for _, text, _ in checks]
    encoded = [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    failures: dict[str, str] = {}
    for (term, text, token_id), ids in zip(checks, encoded):
        if term not in failures and token_id not in ids:
            failures[term] = f"in {text!r} it is split as {backend.encode(text, add_special_tokens=False).tokens}"
    # Added tokens are decoded from their content, which some decoders misread (a byte-level
    # decoder takes "é" for the byte 0xE9): decoding must give the text back, or at least what the
    # base tokenizer gives back. Merge tokens are concatenations of base pieces and decode like them.
    added = [
        (i, check) for i, check in enumerate(checks)
        if check[0] in new_vocab.added_terms and check[0] not in failures
    ]
    if added:
        back = backend.decode_batch([encoded[i] for i, _ in added], skip_special_tokens=False)
        base_ids = [e.ids for e in view.backend.encode_batch_fast([c[1] for _, c in added], add_special_tokens=False)]
        expected = view.backend.decode_batch(base_ids, skip_special_tokens=False)
        for (_, (term, text, _)), got, want in zip(added, back, expected):
            if term not in failures and got != text and got != want:
                failures[term] = f"{text!r} decodes back as {got!r}"
    return failures
