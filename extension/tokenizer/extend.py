"""extend_tokenizer: terms in, a tokenizer in which each term is one token out.

Every term goes in the first way that works, as checked on the built tokenizer:
1. BPE merges appended after the base ones (see merge_plan.py): ordinary BPE to every runtime;
2. a word-boundary added token: llama.cpp keeps only a type for added tokens and loses
   `single_word`, so there they match inside other words — hence second;
3. not at all, reported as a SkippedTerm that says why.
"""

from __future__ import annotations

from typing import Iterable

from ..errors import InvalidOptionError, InvalidTermsError
from ..plan.options import DEFAULTS
from .base_view import BaseView
from .contexts import joined_with_context, terms_failing_in_context
from .merge_plan import Candidate, MergePlan, plan_merges
from .probe_text import (
    ADDED_TOKEN_IN_PROBE,
    MERGES_FIRE_IN_PROBE,
    merges_fired_in_probe,
    occurs_as_word_in_probe,
    terms_in_probe,
)
from .results import ExtendedTokenizer, NewToken, SkippedTerm, TermExtension
from .terms import clean_terms
from .tokenizer_json import NewVocab, assign_ids, build_tokenizer, check_ids

MECHANISMS = ("auto", "merges", "added_tokens")


def extend_tokenizer(tokenizer, terms: Iterable[str], *, max_term_chars: int = DEFAULTS["max_term_chars"], mechanism: str = "auto",
                     embedding_rows: int | None = None) -> ExtendedTokenizer:
    """Add `terms` so each becomes one token in its natural forms. The base tokenizer is not changed.

    mechanism: "auto" (merges where they provably work, else added tokens), "merges" (error for a
    term merges cannot serve), "added_tokens" (every term as a word-boundary added token).
    embedding_rows: the model's embedding rows; new ids start after them and after every id the
    tokenizer uses (see BaseView.first_new_id).
    """
    if mechanism not in MECHANISMS:
        raise InvalidOptionError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}", param="mechanism")
    kept, skipped = clean_terms(terms, max_term_chars=max_term_chars)
    view = BaseView(tokenizer, embedding_rows=embedding_rows)
    if mechanism == "merges" and not view.is_bpe:
        raise InvalidOptionError(
            f"mechanism 'merges' needs a BPE tokenizer, but this one is {view.algorithm!r}; "
            "use mechanism 'auto' or 'added_tokens'",
            param="mechanism",
        )
    candidates, already_one_token = _candidates(view, kept, mechanism)
    skipped += already_one_token
    routing = _Routing(candidates)
    for term, why in joined_with_context(view, routing.merge_terms()).items():
        routing.to_added_token(term, why)

    extended, new_vocab = _build_until_verified(view, routing)

    if mechanism == "merges":
        _refuse_terms_not_served_by_merges(routing)
    skipped += routing.skipped()
    return _result(extended, view, new_vocab, routing.candidates, skipped)


def _candidates(view: BaseView, terms: list[str], mechanism: str) -> tuple[dict[str, Candidate], list[SkippedTerm]]:
    """A candidate for every term with a form that is not yet one base token; the others are skipped."""
    candidates: dict[str, Candidate] = {}
    skipped: list[SkippedTerm] = []
    for term in terms:
        todo, existing = [], {}
        for form in view.forms(term):
            pieces = view.bpe_pieces(form.bpe_string) if view.is_bpe else []
            if len(pieces) == 1 and pieces[0][0] == form.bpe_string:
                existing[form.text] = pieces[0][1]
            else:
                todo.append(form)
        if not view.is_bpe:
            single = view.text_ids(term)
            if len(single) == 1:
                existing[term] = single[0]
                todo = []
        if not todo:
            forms = ", ".join(repr(text) for text in existing)
            skipped.append(SkippedTerm(
                term, "already_single_token", f"{term!r} is already one token of the base tokenizer ({forms}); nothing to add"
            ))
            continue
        candidate = Candidate(term, todo, existing)
        if mechanism == "added_tokens":
            candidate.fallback_reason = "added tokens requested"
        elif not view.is_bpe:
            candidate.fallback_reason = "the tokenizer is not BPE"
        candidates[term] = candidate
    return candidates, skipped


class _Routing:
    """Which way each term goes in. A candidate without a fallback reason goes in as merges, one
    with a reason as an added token; a dropped term does not go in. Terms only ever move down
    that list, one step per demotion."""

    def __init__(self, candidates: dict[str, Candidate]):
        self.candidates = candidates
        self.dropped: dict[str, tuple[str, str]] = {}  # term -> (SkippedTerm.reason, why)

    def merge_terms(self) -> list[str]:
        return [c.term for c in self.candidates.values() if c.fallback_reason is None]

    def added_token_terms(self) -> list[str]:
        return [c.term for c in self.candidates.values() if c.fallback_reason is not None]

    def to_added_token(self, term: str, why: str) -> None:
        self.candidates[term].fallback_reason = why

    def drop(self, term: str, reason: str, why: str) -> None:
        self.dropped[term] = (reason, why)
        del self.candidates[term]

    def demote(self, term: str, *, as_merges: str, as_added_token: tuple[str, str]) -> None:
        """One step down: a merges term becomes an added token (`as_merges` says why), an
        added-token term is dropped (`as_added_token` is its SkippedTerm reason and why)."""
        if self.candidates[term].fallback_reason is None:
            self.to_added_token(term, as_merges)
        else:
            self.drop(term, *as_added_token)

    def skipped(self) -> list[SkippedTerm]:
        return [SkippedTerm(term, reason, f"{term!r} was not added: {why}") for term, (reason, why) in self.dropped.items()]


def _build_until_verified(view: BaseView, routing: _Routing) -> tuple[object, NewVocab]:
    """Plan, build and verify the tokenizer; demote the terms that fail and build again.

    Every failed round demotes at least one term, and a term can be demoted twice at most
    (merges -> added token -> dropped), so this ends. The checks before planning (already one
    token, joined with its context, probe pairs banned) make the first build right as a rule.
    """
    while True:
        plan = _plan_merges_clear_of_probe(view, routing)
        _drop_unusable_added_tokens(view, plan, routing)
        new_vocab = assign_ids(view, plan, routing.added_token_terms())
        extended = build_tokenizer(view, new_vocab)
        check_ids(view, extended, new_vocab)
        backend = extended.backend_tokenizer
        failures = terms_failing_in_context(backend, new_vocab, view, routing.candidates)
        in_probe = terms_in_probe(backend, view, new_vocab.owners())
        if not failures and not in_probe:
            return extended, new_vocab
        # A tokenizer without merges (Unigram, WordPiece) has only added tokens to offer: say so.
        only_added = "" if view.is_bpe else (
            f"the {view.algorithm} tokenizer takes new terms only as added tokens (it has no merges), and an "
            "added token does not make it one token without changing other text: ")
        for term, why in failures.items():
            routing.demote(
                term,
                as_merges=f"merges alone do not make it one token: {why}",
                as_added_token=(
                    "unsupported",
                    f"{only_added}{why}" if only_added else
                    f"neither merges nor an added token make it one token without changing other text: {why}",
                ),
            )
        # Not expected for merges: planned merges never join probe pieces.
        for term in sorted(in_probe - set(failures)):
            routing.demote(term, as_merges=MERGES_FIRE_IN_PROBE, as_added_token=("probe_text", ADDED_TOKEN_IN_PROBE))


def _plan_merges_clear_of_probe(view: BaseView, routing: _Routing) -> MergePlan:
    """Plan merges for every term still routed to them; terms merges cannot serve go to added
    tokens. Planned merges never join probe pieces, so none fires in the probe text — checked all
    the same, re-planning without any term whose merges would."""
    while True:
        plan = plan_merges(view, list(routing.candidates.values()))
        for term, why in plan.failed.items():
            routing.to_added_token(term, why)
        fired = merges_fired_in_probe(view, plan.table) if plan.table.merges else set()
        hit = [term for term, used in plan.merges_used.items() if used & fired]
        if not hit:
            return plan
        for term in hit:
            routing.to_added_token(term, MERGES_FIRE_IN_PROBE)


def _drop_unusable_added_tokens(view: BaseView, plan: MergePlan, routing: _Routing) -> None:
    """Drop the added-token terms that would re-label an existing token or match in the probe text."""
    for term in routing.added_token_terms():
        if term in view.vocab or term in view.added_contents:
            routing.drop(term, "unsupported", (
                f"its text is already the base token {term!r} but its other forms are not, "
                "and an added token would re-label it"
            ))
        elif term in plan.table.created:
            routing.drop(term, "unsupported", f"its text {term!r} is also a new merge token of another term")
        elif occurs_as_word_in_probe(term):
            routing.drop(term, "probe_text", ADDED_TOKEN_IN_PROBE)


def _refuse_terms_not_served_by_merges(routing: _Routing) -> None:
    refused = {c.term: c.fallback_reason for c in routing.candidates.values() if c.fallback_reason}
    refused.update({term: why for term, (_, why) in routing.dropped.items()})
    if refused:
        listing = "; ".join(f"{term!r}: {why}" for term, why in list(refused.items())[:5])
        raise InvalidTermsError(
            f"{len(refused)} term(s) cannot be added with merges ({listing}); use mechanism 'auto' "
            "(they become word-boundary added tokens) or remove them",
            param="terms",
        )


def _result(
    extended, view: BaseView, new_vocab: NewVocab, candidates: dict[str, Candidate], skipped: list[SkippedTerm]
) -> ExtendedTokenizer:
    plan = new_vocab.plan
    form_owner: dict[str, str] = {}  # BPE string of a term's form -> the term
    for term, forms in plan.term_forms.items():
        for bpe_string in forms.values():
            form_owner.setdefault(bpe_string, term)
    new_tokens: list[NewToken] = []
    for string, token_id in new_vocab.merge_token_ids.items():
        is_form = string in form_owner
        new_tokens.append(NewToken(
            id=token_id, token=string, text=view.decode_bpe_string(string),
            base_ids=[i for _, i in view.bpe_pieces(string)],
            kind="form" if is_form else "intermediate",
            term=form_owner[string] if is_form else plan.creator.get(string),
        ))
    for term in new_vocab.added_terms:
        for text, token_id in new_vocab.added_forms(term).items():
            new_tokens.append(NewToken(id=token_id, token=text, text=text, base_ids=[i for _, i in _added_pieces(view, text)],
                                       kind="form", term=term))
    new_tokens.sort(key=lambda t: t.id)

    intermediates_of: dict[str, list[str]] = {}
    for token in new_tokens:
        if token.kind == "intermediate" and token.term is not None:
            intermediates_of.setdefault(token.term, []).append(token.token)
    terms: list[TermExtension] = []
    for term, cand in candidates.items():
        if term in plan.term_forms:
            forms = plan.term_forms[term]
            terms.append(TermExtension(
                term=term, mechanism="merges",
                forms={text: new_vocab.merge_token_ids[bpe_string] for text, bpe_string in forms.items()},
                original_pieces={text: [p for p, _ in view.bpe_pieces(bpe_string)] for text, bpe_string in forms.items()},
                intermediates=intermediates_of.get(term, []),
                existing_forms=dict(cand.existing),
            ))
        else:
            forms = new_vocab.added_forms(term)
            terms.append(TermExtension(
                term=term, mechanism="added_token",
                forms=forms,
                original_pieces={text: [p for p, _ in _added_pieces(view, text)] for text in forms},
                intermediates=[],
                existing_forms=dict(cand.existing),
                fallback_reason=cand.fallback_reason,
            ))
    return ExtendedTokenizer(
        tokenizer=extended,
        base_vocab_size=view.first_new_id,
        terms=terms,
        new_tokens=new_tokens,
        skipped=skipped,
        merges=list(plan.table.merges),
    )


def _added_pieces(view: BaseView, text: str) -> list[tuple[str, int]]:
    """The base pieces an added token stands in for, as (token string, id)."""
    if view.is_bpe:
        return view.mid_word_pieces(text)
    return list(zip(view.text_tokens(text), view.text_ids(text)))
