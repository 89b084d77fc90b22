"""Planning new BPE merges that join each term's base pieces into one token.

Why it is safe: new merges are appended after every base merge, so they can only fire once base
BPE has finished a word, and every merge result is a string the base vocab does not have, so no
base merge can fire after them. A text that contains none of the new token strings therefore
encodes exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .base_view import BaseView, Form
from .probe_text import adjacent_probe_pairs


class MergeTable:
    """New merges, appended after the base ones, and the new vocab strings they create."""

    def __init__(self, base_vocab: dict[str, int], banned: frozenset = frozenset()):
        self.base_vocab = base_vocab
        self.banned = banned  # pairs new merges must not join (adjacent in the probe text)
        self.merges: list[tuple[str, str]] = []
        self.rank: dict[tuple[str, str], int] = {}
        self.created: dict[str, int] = {}  # new string -> order of creation
        self._created_order: list[str] = []

    def run(self, pieces: Sequence[str], fired: set | None = None) -> list[str]:
        """Apply the new merges to a word's base pieces exactly as BPE does: lowest rank first,
        leftmost first among equal ranks. Adds every merge that fires to `fired`."""
        pieces = list(pieces)
        while len(pieces) > 1:
            best_rank, best_at = None, -1
            for at in range(len(pieces) - 1):
                rank = self.rank.get((pieces[at], pieces[at + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_at = rank, at
            if best_rank is None:
                break
            if fired is not None:
                fired.add(self.merges[best_rank])
            pieces[best_at:best_at + 2] = [pieces[best_at] + pieces[best_at + 1]]
        return pieces

    def add(self, left: str, right: str) -> str | None:
        """Append one merge; returns its result when that string is new to the table."""
        result = left + right
        if result in self.base_vocab:
            raise ValueError(f"merge {left!r} + {right!r} makes {result!r}, which the base vocab already has")
        if (left, right) not in self.rank:
            self.rank[(left, right)] = len(self.merges)
            self.merges.append((left, right))
        if result not in self.created:
            self.created[result] = len(self._created_order)
            self._created_order.append(result)
            return result
        return None

    def mark(self) -> tuple[int, int]:
        return len(self.merges), len(self._created_order)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Forget everything added since `mark` (it is all at the end of both lists)."""
        merges, created = mark
        for pair in self.merges[merges:]:
            del self.rank[pair]
        del self.merges[merges:]
        for string in self._created_order[created:]:
            del self.created[string]
        del self._created_order[created:]

    def plan(self, pieces: list[str], target: str, *, prefer_left: bool = True) -> list[tuple[str, str]] | None:
        """Merges that join `pieces` into `target` with every intermediate a new string.

        Interval DP over bracketings: a span may be an inner node only if its string is not a base
        token (a merge producing an existing token could let base merges fire after it), and no
        merge may join a banned pair. Among valid trees, fewest new strings first; ties go to the
        left-leaning tree (prefixes, shared between terms) or the right-leaning one (suffixes,
        shared between a term's two forms).
        """
        count = len(pieces)
        best: dict[tuple[int, int], tuple[int, int]] = {}
        for width in range(2, count + 1):
            for i in range(0, count - width + 1):
                j = i + width
                text = "".join(pieces[i:j])
                if (i, j) != (0, count) and text in self.base_vocab:
                    continue
                node_cost = 0 if text in self.created else 1
                splits = range(j - 1, i, -1) if prefer_left else range(i + 1, j)
                choice = None
                for m in splits:
                    left = 0 if m - i == 1 else best.get((i, m), (None,))[0]
                    right = 0 if j - m == 1 else best.get((m, j), (None,))[0]
                    if left is None or right is None:
                        continue
                    if self.banned and ("".join(pieces[i:m]), "".join(pieces[m:j])) in self.banned:
                        continue
                    cost = node_cost + left + right
                    if choice is None or cost < choice[0]:
                        choice = (cost, m)
                if choice is not None:
                    best[(i, j)] = choice
        if (0, count) not in best:
            return None
        merges: list[tuple[str, str]] = []

        def emit(i: int, j: int) -> str:
            if j - i == 1:
                return pieces[i]
            m = best[(i, j)][1]
            left, right = emit(i, m), emit(m, j)
            merges.append((left, right))
            return left + right

        emit(0, count)
        return merges


@dataclass
class Candidate:
    """A term on its way in: merges until `fallback_reason` says why not, then an added token."""

    term: str
    forms: list[Form]  # forms that are not yet one base token
    existing: dict[str, int]  # forms that already are, text -> base id
    fallback_reason: str | None = None  # set once merges are ruled out for it


@dataclass
class MergePlan:
    table: MergeTable
    term_forms: dict[str, dict[str, str]] = field(default_factory=dict)  # term -> {form text: BPE string}
    merges_used: dict[str, set] = field(default_factory=dict)  # term -> merges it relies on
    creator: dict[str, str] = field(default_factory=dict)  # new string -> first term that created it
    failed: dict[str, str] = field(default_factory=dict)  # term -> why merges could not be planned


def plan_merges(view: BaseView, candidates: list[Candidate]) -> MergePlan:
    """Plan every candidate without a fallback reason, in order, each on top of the merges
    planned before it.

    No planned merge joins two pieces that are adjacent in the probe text's base tokenization:
    as long as none does, no new merge fires there at all, so the probe keeps its ids."""
    plan = MergePlan(MergeTable(view.vocab, adjacent_probe_pairs(view)))
    table = plan.table
    for cand in candidates:
        if cand.fallback_reason is not None:
            continue
        forms, reason = _form_pieces(view, cand)
        if reason is not None:
            plan.failed[cand.term] = reason
            continue
        mark = table.mark()
        uses, created, reason = _add_term(table, forms, prefer_left=True)
        if reason is None and len(forms) > 1 and len(created) > len(forms):
            # Two forms usually differ only in their first piece: a right-leaning first form lets
            # the second reuse its suffix strings. Keep whichever needs fewer new strings.
            table.rollback(mark)
            alt_uses, alt_created, alt_reason = _add_term(table, forms, prefer_left=False)
            if alt_reason is not None or len(alt_created) >= len(created):
                table.rollback(mark)
                uses, created, reason = _add_term(table, forms, prefer_left=True)
            else:
                uses, created = alt_uses, alt_created
        if reason is not None:
            table.rollback(mark)
            plan.failed[cand.term] = reason
            continue
        for string in created:
            plan.creator.setdefault(string, cand.term)
        plan.term_forms[cand.term] = {form.text: form.bpe_string for form, _ in forms}
        plan.merges_used[cand.term] = uses
    return plan


def _form_pieces(view: BaseView, cand: Candidate) -> tuple[list[tuple[Form, list[str]]], str | None]:
    result = []
    for form in cand.forms:
        if not form.one_pretoken:
            return [], f"the pre-tokenizer splits {form.text!r} into several words before BPE"
        pieces = view.bpe_pieces(form.bpe_string)
        if not view.mergeable_pieces(pieces, form.bpe_string):
            return [], f"{form.text!r} needs byte-fallback or unknown pieces, which merges cannot join"
        result.append((form, [piece for piece, _ in pieces]))
    return result, None


def _add_term(table: MergeTable, forms: list[tuple[Form, list[str]]], prefer_left: bool) -> tuple[set, list[str], str | None]:
    """Plan and append the merges of one term's forms; (merges used, strings created, failure)."""
    uses: set = set()
    created: list[str] = []
    for number, (form, base_pieces) in enumerate(forms):
        current = table.run(base_pieces)
        if current != [form.bpe_string]:
            merges = table.plan(current, form.bpe_string, prefer_left=prefer_left or number > 0)
            if merges is None:
                return uses, created, _no_plan_reason(table, current, form, base_pieces)
            for left, right in merges:
                string = table.add(left, right)
                if string is not None:
                    created.append(string)
        fired: set = set()
        if table.run(base_pieces, fired) != [form.bpe_string]:
            return uses, created, f"the new merges do not join {base_pieces} into {form.bpe_string!r}"
        uses |= fired
    return uses, created, None


def _no_plan_reason(table: MergeTable, current: list[str], form: Form, base_pieces: list[str]) -> str:
    banned, table.banned = table.banned, frozenset()
    try:
        possible = table.plan(current, form.bpe_string) is not None
    finally:
        table.banned = banned
    if possible:
        return (f"every way of joining {base_pieces} would also join pieces of llama.cpp's converter "
                "probe text, and GGUF conversion would then refuse the model")
    return f"every way of joining {base_pieces} passes through a string the base vocab already has"
