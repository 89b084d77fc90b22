"""Mining whole words: each new token is a complete pre-token (word) of the corpus.

Pair merging (bpe_continuation) spends the budget on whatever adjacent pieces occur most, so it
also offers word-internal fragments (`erper`, `ontra`) whose rows start from a poor subword mean
and fire inside words the corpus barely has. Here the candidates are the corpus's distinct words,
ranked by the tokens they would save (frequency x (pieces - 1)); each is joined by the fewest new
merges (tokenizer.merge_plan's planner, which never passes through a base-vocab string or a pair
of the converter probe text), and the only other new entries are the intermediates those merges
need, all counted against the same budget.

Merges are appended in the order the words are taken, so a word planned earlier can never be
broken by a later one: BPE applies the lowest rank first, and every word's own merges rank below
anything added after it. The result is a `Continuation`, like pair merging's, so the miner checks
and reports it the same way.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Mapping, Sequence

from ..errors import JobCancelled
from ..tokenizer.merge_plan import MergeTable
from .bpe_continuation import Continuation, Merge


def join_whole_words(
    words: Iterable[tuple[Sequence[int], int]],
    names: Mapping[int, str],
    base_vocab: Mapping[str, int],
    *,
    max_merges: int,
    min_count: int,
    reject: Callable[[str, str, str], str | None],
    banned_pairs: set[tuple[str, str]] = frozenset(),
    should_cancel: Callable[[], bool] | None = None,
) -> Continuation:
    """Up to `max_merges` new entries (words and their intermediates), most tokens saved first.

    words: (base piece ids, frequency) per distinct word; names: base piece id -> token string.
    reject(left, right, merged) -> a reason to refuse a new string, or None (as in continue_bpe).
    """
    counted: Counter = Counter()
    for pieces, freq in words:
        if len(pieces) >= 2:
            counted[tuple(pieces)] += freq
    segments = [([names[i] for i in pieces], freq) for pieces, freq in counted.items()]
    table = MergeTable(dict(base_vocab), frozenset(banned_pairs))
    skipped: Counter = Counter()
    # Most tokens saved first; ties in a fixed order (the word's string) so a job is repeatable.
    ranked = sorted((s for s in segments if s[1] >= min_count), key=lambda s: (-(len(s[0]) - 1) * s[1], "".join(s[0])))
    for number, (strings, freq) in enumerate(ranked):
        if len(table.created) >= max_merges:
            break
        if should_cancel is not None and number % 256 == 0 and should_cancel():
            raise JobCancelled("cancelled while mining")
        target = "".join(strings)
        current = table.run(strings)
        if current == [target]:
            continue  # earlier words' merges already join it
        reason = "in_vocab" if target in base_vocab else None
        plan = None if reason else table.plan(current, target)
        if plan is None:
            skipped[reason or "no_plan"] += 1
            continue
        mark = table.mark()
        for left, right in plan:
            if (left, right) not in table.rank and left + right in table.created:
                reason = reason or "string_made_twice"  # one vocab entry, two merges: keep one way in
            reason = reason or reject(left, right, left + right)
            if reason is None:
                table.add(left, right)
        if reason is None and len(table.created) > max_merges:
            reason = "over_budget"
        if reason is None and table.run(strings) != [target]:
            reason = "not_joined"
        if reason is not None:
            table.rollback(mark)
            skipped[reason] += 1
    return _replay(segments, table.merges, skipped)


def _replay(segments: list[tuple[list[str], int]], merges: list[tuple[str, str]], skipped: Counter) -> Continuation:
    """The chosen merges applied to every training word as BPE applies them (lowest rank first):
    tokens each merge saved, how often each new token is left standing, and which merges feed
    later ones — what the miner reports for pair merging too."""
    rank = {pair: r for r, pair in enumerate(merges)}
    saved = [0] * len(merges)
    usage = [0] * len(merges)
    index = {left + right: r for r, (left, right) in enumerate(merges)}
    tokens_before = tokens_after = 0
    for strings, freq in segments:
        tokens_before += len(strings) * freq
        pieces = list(strings)
        while len(pieces) > 1:
            best = min(((rank[p], at) for at, p in enumerate(zip(pieces, pieces[1:])) if p in rank), default=None)
            if best is None:
                break
            r, at = best
            pieces[at:at + 2] = [pieces[at] + pieces[at + 1]]
            saved[r] += freq
        tokens_after += len(pieces) * freq
        for piece in pieces:
            if piece in index:
                usage[index[piece]] += freq
    base_pieces: dict[str, list[str]] = {}
    for left, right in merges:
        base_pieces[left + right] = base_pieces.get(left, [left]) + base_pieces.get(right, [right])
    fed = {side for pair in merges for side in pair}
    return Continuation(
        merges=[Merge(left=l, right=r, token=l + r, tokens_saved=saved[k]) for k, (l, r) in enumerate(merges)],
        usage=usage,
        pieces=[base_pieces[l + r] for l, r in merges],
        used_by_later_merge=[l + r in fed for l, r in merges],
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        skipped=skipped,
    )
