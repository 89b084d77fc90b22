"""Corpus -> the new vocabulary entries that save the most tokens, checked on every document.

Three streamed passes at most, never the corpus in memory:
1. count the pre-tokens (words) of the training split: words repeat, so a Counter of them is
   the compact form of the corpus;
2. continue BPE on those words (bpe_continuation) and build the extended tokenizer from the
   merges;
3. encode every document (both splits) with the base and the extended tokenizer: the no-longer
   guarantee and the tokens-per-byte numbers.
Held-out documents are only ever seen in pass 3.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..plan.corpus import is_held_out, iter_documents
from ..errors import InvalidCorpusError, JobCancelled
from ..plan.options import BY_NAME, DEFAULTS
from .bpe_continuation import Continuation, continue_bpe
from .check import EncodingCheck, compare_encodings
from .whole_words import join_whole_words
from .filters import MiningFilters
from .result import MinedTerm, MiningResult
from .vocabulary import TokenizerView

_REPAIR_ROUNDS = 5


def mine_terms(
    tokenizer,
    corpus_path: Path | str,
    *,
    max_new_tokens: int = DEFAULTS["max_new_tokens"],
    min_frequency: int = DEFAULTS["min_frequency"],
    mining_unit: str = DEFAULTS["mining_unit"],
    text_field: str = "text",
    filters: MiningFilters | None = None,
    should_cancel: Callable[[], bool] | None = None,
    corpus_name: str | None = None,
    on_progress: Callable[[int], None] | None = None,
    embedding_rows: int | None = None,
) -> MiningResult:
    """Mine a corpus file (UTF-8 text, documents separated by blank lines, or JSONL).
    `corpus_name` is how the report names it (default: the file's name). `on_progress(read)`
    hears how many documents the passes over the file have read so far, all passes together
    (two: counting words, then checking every document's encoding; more only after a repair)."""
    path = Path(corpus_path)
    read = 0

    def documents() -> Iterator[str]:
        nonlocal read
        for document in iter_documents(path, text_field=text_field):
            yield document
            read += 1
            if on_progress is not None and read % 256 == 0:
                on_progress(read)

    return _mine(
        tokenizer, documents, source={"file": path.name if corpus_name is None else corpus_name, "text_field": text_field},
        max_new_tokens=max_new_tokens, min_frequency=min_frequency, mining_unit=mining_unit,
        filters=filters or MiningFilters(), should_cancel=should_cancel, param="corpus", embedding_rows=embedding_rows,
    )


def check_mining_options(max_new_tokens: int, min_frequency: int, mining_unit: str = DEFAULTS["mining_unit"]) -> None:
    BY_NAME["max_new_tokens"].check(max_new_tokens)
    BY_NAME["min_frequency"].check(min_frequency)
    BY_NAME["mining_unit"].check(mining_unit)


def count_words(
    view: TokenizerView,
    documents: Iterable[str],
    filters: MiningFilters,
    should_cancel: Callable[[], bool] | None,
) -> tuple[Counter, dict]:
    counts: Counter = Counter()
    stats = {"documents": 0, "bytes": 0, "train_documents": 0, "held_out_documents": 0}
    for doc in documents:
        stats["documents"] += 1
        stats["bytes"] += len(doc.encode("utf-8"))
        if is_held_out(doc):
            stats["held_out_documents"] += 1
            continue
        stats["train_documents"] += 1
        for segment in filters.clean_segments(doc):
            counts.update(view.words(segment))
        if should_cancel is not None and stats["documents"] % 1024 == 0 and should_cancel():
            raise JobCancelled("cancelled while counting the corpus")
    return counts, stats


def _word_pieces(view: TokenizerView, counts: Counter) -> tuple[list[tuple[tuple[int, ...], int]], dict[int, str]]:
    """Distinct words as base piece ids (+ the ids' strings), cut at pieces no merge can use
    (byte fallback, unk). Ids in tuples: the compact form, one per distinct word."""
    words = []
    names: dict[int, str] = {}
    for word, freq in counts.items():
        run: list[int] = []
        for piece_id, token in view.pieces(word):
            if view.mergeable(token):
                run.append(piece_id)
                names[piece_id] = token
                continue
            if len(run) > 1:
                words.append((tuple(run), freq))
            run = []
        if len(run) > 1:
            words.append((tuple(run), freq))
    return words, names


def _probe_pairs(view: TokenizerView) -> set[tuple[str, str]]:
    """Adjacent base-token pairs of llama.cpp's converter probe text.

    The base tokenizer reaches these pieces first and new merges rank after every base merge, so
    a new merge can only fire in the probe text if its pair is adjacent there: refusing those
    pairs keeps the probe's ids — and so llama.cpp's pre-tokenizer hash — unchanged.
    """
    from ..tokenizer import LLAMA_CPP_PROBE_TEXT

    tokens = view.backend.encode(LLAMA_CPP_PROBE_TEXT, add_special_tokens=False).tokens
    return set(zip(tokens, tokens[1:]))


def _mine(
    tokenizer,
    documents: Callable[[], Iterator[str]],
    *,
    source: dict,
    max_new_tokens: int,
    min_frequency: int,
    mining_unit: str,
    filters: MiningFilters,
    should_cancel: Callable[[], bool] | None,
    param: str,
    embedding_rows: int | None = None,
) -> MiningResult:
    from ..tokenizer import extend_with_merges, probe_text_unchanged

    check_mining_options(max_new_tokens, min_frequency, mining_unit)
    view = TokenizerView(tokenizer)
    seconds: dict[str, float] = {}

    started = time.perf_counter()
    counts, stats = count_words(view, documents(), filters, should_cancel)
    if stats["documents"] == 0:
        raise InvalidCorpusError(
            "the corpus is empty (no non-blank text); give UTF-8 text with documents separated by "
            "blank lines, or JSONL with a text field",
            param=param,
        )
    words, names = _word_pieces(view, counts)
    corpus_stats = {**stats, "distinct_words": len(counts), "word_occurrences": sum(counts.values())}
    del counts  # the words live on as piece ids
    seconds["count"] = round(time.perf_counter() - started, 3)

    def reject(_left: str, _right: str, token: str) -> str | None:
        if view.token_id(token) is not None:
            return "in_vocab"
        return filters.reject_reason(view.token_bytes(token))

    banned = _probe_pairs(view)
    repairs: list[dict] = []
    seconds["merge"] = seconds["extend"] = seconds["check"] = 0.0
    while True:
        started = time.perf_counter()
        if mining_unit == "words":
            continuation = join_whole_words(
                words, names, view.backend.get_vocab(with_added_tokens=False), max_merges=max_new_tokens,
                min_count=min_frequency, reject=reject, banned_pairs=banned, should_cancel=should_cancel,
            )
        else:
            continuation = continue_bpe(
                words, names, max_merges=max_new_tokens, min_count=min_frequency, reject=reject,
                banned_pairs=banned, should_cancel=should_cancel,
            )
        merges = [(m.left, m.right) for m in continuation.merges]
        seconds["merge"] += round(time.perf_counter() - started, 3)
        started = time.perf_counter()
        extended = extend_with_merges(tokenizer, merges, embedding_rows=embedding_rows)
        seconds["extend"] += round(time.perf_counter() - started, 3)
        if not merges:
            check = None
            break
        started = time.perf_counter()
        check = compare_encodings(
            view.backend, extended.tokenizer.backend_tokenizer, documents(),
            base_vocab_size=extended.base_vocab_size, should_cancel=should_cancel,
        )
        seconds["check"] += round(time.perf_counter() - started, 3)
        if check.longer == 0 or len(repairs) == _REPAIR_ROUNDS:
            break
        # Not expected (new merges rank after all base merges), but if a document got longer,
        # refuse every new merge that fired in it and mine again rather than ship it.
        culprits = _merges_of_ids(extended, merges, check.culprit_ids)
        if not culprits:
            break
        repairs.append({"documents_longer": check.longer, "refused_merges": [list(p) for p in sorted(culprits)]})
        banned = banned | culprits

    terms = _terms(view, continuation, extended, min_frequency)
    report = _report(
        source=source, stats=corpus_stats, continuation=continuation, check=check,
        terms=terms, max_new_tokens=max_new_tokens, min_frequency=min_frequency, mining_unit=mining_unit, filters=filters,
        repairs=repairs, probe_ok=probe_text_unchanged(tokenizer, extended.tokenizer) if merges else True,
        seconds=seconds,
    )
    return MiningResult(merges=merges, terms=terms, extended=extended, report=report)


def _merges_of_ids(extended, merges: list[tuple[str, str]], ids: set[int]) -> set[tuple[str, str]]:
    tokens = {extended.tokenizer.convert_ids_to_tokens(i) for i in ids}
    return {pair for pair in merges if pair[0] + pair[1] in tokens}


def _terms(view: TokenizerView, continuation: Continuation, extended, min_frequency: int) -> list[MinedTerm]:
    token_id = extended.tokenizer.backend_tokenizer.token_to_id
    terms = []
    for rank, merge in enumerate(continuation.merges):
        # A step toward longer tokens that is itself seldom left standing in the text.
        intermediate = continuation.used_by_later_merge[rank] and (
            continuation.usage[rank] < max(min_frequency, merge.tokens_saved // 10)
        )
        pieces = continuation.pieces[rank]
        terms.append(MinedTerm(
            rank=rank,
            token=merge.token,
            text=view.token_text(merge.token),
            id=token_id(merge.token),
            merge=(merge.left, merge.right),
            tokens_saved=merge.tokens_saved,
            frequency=continuation.usage[rank],
            original_pieces=list(pieces),
            original_ids=[view.token_id(p) for p in pieces],
            original_texts=[view.token_text(p) for p in pieces],
            kind="intermediate" if intermediate else "term",
        ))
    return terms


def _report(
    *,
    source: dict,
    stats: dict,
    continuation: Continuation,
    check: EncodingCheck | None,
    terms: list[MinedTerm],
    max_new_tokens: int,
    min_frequency: int,
    mining_unit: str,
    filters: MiningFilters,
    repairs: list[dict],
    probe_ok: bool,
    seconds: dict,
) -> dict:
    report: dict = {
        "source": source,
        "corpus": stats,
        "params": {"max_new_tokens": max_new_tokens, "min_frequency": min_frequency, "mining_unit": mining_unit,
                   "filters": filters.to_json()},
        "new_tokens": len(terms),
        "terms_count": sum(t.kind == "term" for t in terms),
        "intermediates_count": sum(t.kind == "intermediate" for t in terms),
        "skipped_candidates": dict(sorted(continuation.skipped.items())),
        "mined_tokens_saved": continuation.tokens_before - continuation.tokens_after,
        "probe_text_unchanged": probe_ok,
        "repairs": repairs,
        "seconds": seconds,
    }
    if check is None:
        report["status"] = "no_terms"
        report["message"] = (
            f"the corpus is too small to yield any term: no candidate occurs at least {min_frequency} "
            f"times in its {stats['train_documents']} training documents ({stats['bytes']} bytes in "
            "all); give a larger corpus or a lower min_frequency"
        )
        report["guarantee"] = {"documents_checked": 0, "documents_longer": 0, "passed": True, "examples": []}
        return report
    report["status"] = "ok" if check.longer == 0 else "guarantee_failed"
    report["message"] = (
        f"{len(terms)} new tokens; held-out tokens per byte "
        f"{_fmt(check.held_out.to_json()['tokens_per_byte_before'])} -> "
        f"{_fmt(check.held_out.to_json()['tokens_per_byte_after'])}; "
        f"{check.longer} of {check.documents} documents longer"
    )
    report["train"] = check.train.to_json()
    report["held_out"] = {**check.held_out.to_json(), "new_tokens_used": len(check.held_out_new_ids)}
    report["guarantee"] = check.guarantee()
    return report


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
