"""`tide mine`: corpus -> the new vocabulary entries that save the most tokens, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli_options import add_option_flags

FILTER_KINDS = ("digits", "punctuation", "urls", "control")
MINING_OPTIONS = ["max_new_tokens", "min_frequency", "mining_unit", "corpus_text_field"]


def register(sub) -> None:
    parser = sub.add_parser(
        "mine",
        help="choose new terms from a domain corpus (continues the base tokenizer's BPE merges)",
        description="Mine the new vocabulary entries that save the most tokens on a corpus, check "
        "that no document gets longer, and report tokens per byte on the held-out split.",
    )
    parser.add_argument("--corpus", type=Path, required=True, help="UTF-8 text (documents separated by blank lines) or JSONL")
    parser.add_argument("--base-model", default="smollm2-135m", help="whose tokenizer to extend: built-in name, models-dir name or local folder (default: %(default)s)")
    add_option_flags(parser, MINING_OPTIONS)
    parser.add_argument(
        "--keep", action="append", choices=FILTER_KINDS, default=[],
        help="switch a candidate filter off (repeatable): digits, punctuation, urls, control",
    )
    parser.add_argument("--top", type=int, default=50, help="table rows to print; 0 = all (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from app.settings import get_settings
    from extension.mining import MiningFilters, mine_terms
    from extension.plan.options import check_options
    from extension.plan.models import load_tokenizer, resolve_model

    check_options(args, MINING_OPTIONS)
    sources = get_settings().model_sources()
    resolved = resolve_model(args.base_model, sources, allow_local_paths=True)
    tokenizer = load_tokenizer(resolved, sources)
    filters = MiningFilters(**{kind: False for kind in args.keep})
    print(f"mining {args.corpus} with the {args.base_model} tokenizer ...", file=sys.stderr)
    result = mine_terms(
        tokenizer, args.corpus, max_new_tokens=args.max_new_tokens,
        min_frequency=args.min_frequency, mining_unit=args.mining_unit, text_field=args.corpus_text_field, filters=filters,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    else:
        print(format_table(result, top=args.top))
    return 0 if result.report["guarantee"]["passed"] else 1


def format_table(result, *, top: int = 50) -> str:
    report = result.report
    lines = []
    terms = result.terms if top <= 0 else result.terms[:top]
    if terms:
        text_width = min(32, max(len(repr(t.text)) for t in terms))
        lines.append(f"{'rank':>5}  {'saved':>8}  {'freq':>8}  {'kind':<12}  {'term':<{text_width}}  original pieces")
        for term in terms:
            pieces = " | ".join(repr(piece) for piece in term.original_texts)
            lines.append(
                f"{term.rank:>5}  {term.tokens_saved:>8}  {term.frequency:>8}  {term.kind:<12}  "
                f"{repr(term.text):<{text_width}}  {pieces}"
            )
        if len(terms) < len(result.terms):
            lines.append(f"  ... {len(result.terms) - len(terms)} more (use --top 0 or --json)")
        lines.append("")
    corpus = report["corpus"]
    lines.append(
        f"corpus: {corpus['documents']} documents, {corpus['bytes']} bytes "
        f"({corpus['train_documents']} train, {corpus['held_out_documents']} held out)"
    )
    lines.append(
        f"new vocabulary entries: {report['new_tokens']} ({report['terms_count']} terms, "
        f"{report['intermediates_count']} intermediates); skipped candidates: "
        + (", ".join(f"{k} {v}" for k, v in report["skipped_candidates"].items()) or "none")
    )
    if report["status"] == "no_terms":
        lines.append(report["message"])
        return "\n".join(lines)
    held = report["held_out"]
    if held["tokens_per_byte_before"] is not None:
        lines.append(
            f"held-out tokens per byte: {held['tokens_per_byte_before']:.4f} -> {held['tokens_per_byte_after']:.4f} "
            f"({100 * held['relative_change']:+.2f}%), {held['new_tokens_used']} new tokens used"
        )
    else:
        lines.append("held-out split is empty (corpus too small to hold documents out)")
    guarantee = report["guarantee"]
    verdict = "passed" if guarantee["passed"] else "FAILED"
    lines.append(
        f"no-longer check {verdict}: {guarantee['documents_longer']} of {guarantee['documents_checked']} "
        f"documents encode longer than with the base tokenizer"
    )
    lines.append(f"llama.cpp probe text unchanged: {'yes' if report['probe_text_unchanged'] else 'NO'}")
    lines.append("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in report["seconds"].items()))
    return "\n".join(lines)
