"""`tide extend`: the main job, from the terminal."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub) -> None:
    defaults = _spec_defaults()
    parser = sub.add_parser(
        "extend",
        help="add terms to a model's tokenizer, initialise and train the new rows, publish a checkpoint",
        description="At least one of --terms / --corpus. With only --corpus the terms are mined from it.",
    )
    parser.add_argument("--base-model", required=True, help="built-in name (smollm2-135m, gemma3-270m), a folder under the models dir, or a local model folder")
    parser.add_argument("--terms", type=Path, help="UTF-8 file, one term per line")
    parser.add_argument("--corpus", type=Path, help="domain text (documents separated by blank lines) or JSONL")
    parser.add_argument("--text-field", default=defaults["corpus_text_field"], help="JSONL field holding the text (default: %(default)s)")
    parser.add_argument("--out", type=Path, required=True, help="folder to write; refused if it exists unless --force")
    parser.add_argument("--force", action="store_true", help="replace an existing --out folder")
    parser.add_argument("--max-new-tokens", type=int, default=defaults["max_new_tokens"], help="mining budget of new vocabulary entries (default: %(default)s)")
    parser.add_argument("--max-term-chars", type=int, default=defaults["max_term_chars"], help="longest accepted term (default: %(default)s)")
    parser.add_argument("--pad-to-multiple-of", type=int, default=defaults["pad_to_multiple_of"], help="pad the vocab to a multiple of N; 1 disables (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=defaults["steps"], help="training steps over the new rows; 0 = initialise only (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=defaults["batch_size"], help="sequences per step (default: %(default)s)")
    parser.add_argument("--seq-len", type=int, default=defaults["seq_len"], help="tokens per sequence (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=defaults["lr"], help="base learning rate (default: %(default)s)")
    parser.add_argument("--embedding-lr-multiplier", type=float, default=defaults["embedding_lr_multiplier"], help="learning-rate multiplier for embedding rows (default: %(default)s)")
    parser.add_argument("--weight-decay", type=float, default=defaults["weight_decay"], help="AdamW weight decay on the new rows (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults["seed"], help="random seed (default: %(default)s)")
    parser.add_argument("--eval-bytes", type=int, default=defaults["eval_max_bytes"], help="bytes of held-out domain text and of general text scored before/after (default: %(default)s)")
    parser.add_argument("--work-dir", type=Path, help="checkpoint folder; rerunning with the same folder resumes")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a summary")
    parser.set_defaults(handler=_run)


def _spec_defaults() -> dict:
    from dataclasses import fields

    from extension.spec import ExtendSpec

    return {f.name: f.default for f in fields(ExtendSpec) if f.default is not f.default_factory}


def _run(args: argparse.Namespace) -> int:
    from app.settings import get_settings
    from extension.errors import InvalidOptionError
    from extension.pipeline import run
    from extension.spec import ExtendSpec
    from extension.tokenizer import read_terms_file

    from .progress import TerminalProgress

    if args.terms is None and args.corpus is None:
        raise InvalidOptionError("give --terms FILE, --corpus FILE, or both", param="terms")
    spec = ExtendSpec(
        base_model=args.base_model,
        out_dir=args.out,
        terms=read_terms_file(args.terms) if args.terms else None,
        corpus_path=args.corpus,
        corpus_text_field=args.text_field,
        corpus_name=str(args.corpus) if args.corpus else None,
        max_new_tokens=args.max_new_tokens,
        max_term_chars=args.max_term_chars,
        pad_to_multiple_of=args.pad_to_multiple_of,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        embedding_lr_multiplier=args.embedding_lr_multiplier,
        weight_decay=args.weight_decay,
        seed=args.seed,
        eval_max_bytes=args.eval_bytes,
        allow_local_paths=True,
        force=args.force,
    )
    with TerminalProgress(work_dir=args.work_dir) as callbacks:
        result = run(spec, callbacks, sources=get_settings().model_sources())
    if args.json:
        print(json.dumps({"out_dir": str(result.out_dir), "metrics": result.metrics}, indent=2, default=str))
    else:
        print(result.summary())
    return 0
