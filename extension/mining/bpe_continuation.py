"""Continue BPE training on top of a tokenizer's existing merges.

The `tokenizers` trainers cannot resume from existing merges, so this is the merge loop itself,
kept small: words are the corpus's distinct pre-tokens (weighted by frequency) already split
into their base pieces; each step merges the adjacent pair that occurs most often, which is the
pair that saves the most tokens. Because every new merge ranks after all base merges, the real
tokenizer first reaches exactly these base pieces and then applies the new merges in this
order — so every new token is reachable, and no word can get longer (each merge only joins).

Pair counts are updated incrementally (only the words that contain the merged pair are
touched) and the best pair comes from a heap with lazy invalidation, so a step costs time in
proportion to the words it changes, not to the corpus.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from ..errors import JobCancelled

Pair = tuple[int, int]


@dataclass(frozen=True)
class Merge:
    left: str
    right: str
    token: str
    tokens_saved: int  # tokens the merge removed from the training words when it was made


@dataclass
class Continuation:
    merges: list[Merge]
    usage: list[int]  # per merge: occurrences of its token in the final segmentation
    pieces: list[list[str]]  # per merge: the base pieces its token replaces
    used_by_later_merge: list[bool]
    tokens_before: int
    tokens_after: int
    skipped: Counter = field(default_factory=Counter)


def continue_bpe(
    words: Iterable[tuple[Sequence[int], int]],
    names: Mapping[int, str],
    *,
    max_merges: int,
    min_count: int,
    reject: Callable[[str, str, str], str | None],
    banned_pairs: set[tuple[str, str]] = frozenset(),
    should_cancel: Callable[[], bool] | None = None,
) -> Continuation:
    """Run up to `max_merges` merges over weighted words.

    words: (base piece ids, frequency) per distinct word; names: base piece id -> token string.
    reject(left, right, merged) -> a reason to skip that pair, or None to accept it.
    banned_pairs: pairs (as token strings) that must never merge (e.g. the converter probe text).
    """
    names = dict(names)
    segments: list[list[int]] = []
    freqs: list[int] = []
    for pieces, freq in words:
        if len(pieces) >= 2:
            segments.append(list(pieces))
            freqs.append(freq)
    tokens_before = sum(len(seg) * f for seg, f in zip(segments, freqs))
    next_id = max(names, default=-1) + 1
    first_new = next_id

    counts: dict[Pair, int] = defaultdict(int)
    where: dict[Pair, set[int]] = defaultdict(set)
    for index, (seg, freq) in enumerate(zip(segments, freqs)):
        for pair in zip(seg, seg[1:]):
            counts[pair] += freq
            where[pair].add(index)
    heap = [(-count, names[a], names[b], a, b) for (a, b), count in counts.items()]
    heapq.heapify(heap)

    merges: list[Merge] = []
    base_pieces: dict[int, list[str]] = {}
    components: list[Pair] = []
    refused: set[Pair] = set()
    skipped: Counter = Counter()
    seen_tokens: set[str] = set()

    while heap and len(merges) < max_merges:
        neg, _, _, a, b = heapq.heappop(heap)
        pair = (a, b)
        current = counts.get(pair, 0)
        if current != -neg:  # stale entry: the pair lost occurrences since it was pushed
            if current > 0:
                heapq.heappush(heap, (-current, names[a], names[b], a, b))
            continue
        if current < min_count:
            break
        if pair in refused:
            continue
        left, right = names[a], names[b]
        token = left + right
        reason = "probe_text" if (left, right) in banned_pairs else None
        reason = reason or ("in_vocab" if token in seen_tokens else None) or reject(left, right, token)
        if reason:
            refused.add(pair)
            skipped[reason] += 1
            continue
        if should_cancel is not None and len(merges) % 16 == 0 and should_cancel():
            raise JobCancelled("cancelled while mining")

        new = next_id
        next_id += 1
        names[new] = token
        seen_tokens.add(token)
        base_pieces[new] = base_pieces.get(a, [left]) + base_pieces.get(b, [right])
        components.append(pair)
        saved = 0
        grown: set[Pair] = set()
        for index in where.pop(pair):
            seg = segments[index]
            merged, joined = _merge_word(seg, a, b, new)
            if not joined:
                continue  # the word lost this pair to an earlier merge
            freq = freqs[index]
            saved += joined * freq
            for old in zip(seg, seg[1:]):
                counts[old] -= freq
            for fresh in zip(merged, merged[1:]):
                counts[fresh] += freq
                where[fresh].add(index)
                if new in fresh:
                    grown.add(fresh)
            segments[index] = merged
        counts.pop(pair, None)
        merges.append(Merge(left=left, right=right, token=token, tokens_saved=saved))
        for fresh in sorted(grown):
            heapq.heappush(heap, (-counts[fresh], names[fresh[0]], names[fresh[1]], fresh[0], fresh[1]))

    usage = [0] * len(merges)
    for seg, freq in zip(segments, freqs):
        for symbol in seg:
            if symbol >= first_new:
                usage[symbol - first_new] += freq
    later = {symbol for pair in components for symbol in pair if symbol >= first_new}
    return Continuation(
        merges=merges,
        usage=usage,
        pieces=[base_pieces[first_new + i] for i in range(len(merges))],
        used_by_later_merge=[first_new + i in later for i in range(len(merges))],
        tokens_before=tokens_before,
        tokens_after=sum(len(seg) * f for seg, f in zip(segments, freqs)),
        skipped=skipped,
    )


def _merge_word(seg: list[int], a: int, b: int, new: int) -> tuple[list[int], int]:
    """Join every non-overlapping (a, b) left to right, as BPE does; return (word, joins)."""
    out: list[int] = []
    joins = 0
    i = 0
    last = len(seg) - 1
    while i <= last:
        if i < last and seg[i] == a and seg[i + 1] == b:
            out.append(new)
            joins += 1
            i += 2
        else:
            out.append(seg[i])
            i += 1
    return out, joins
