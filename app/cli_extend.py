"""`tide extend`: the main job, from the terminal."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .cli_options import add_option_flags, option_values


def register(sub) -> None:
    parser = sub.add_parser(
        "extend",
        help="add terms to a model's tokenizer, initialise and train the new rows, publish a checkpoint",
        description="At least one of --terms / --corpus. With only --corpus the terms are mined from it.",
    )
    parser.add_argument("--base-model", required=True, help="built-in name (smollm2-135m, gemma3-270m), a folder under the models dir, or a local model folder")
    parser.add_argument("--terms", type=Path, help="UTF-8 file, one term per line")
    parser.add_argument("--corpus", type=Path, help="domain text (documents separated by blank lines) or JSONL")
    parser.add_argument("--examples", type=Path, help="with --terms and no --corpus: a few documents of your own text "
                        "(blank-line separated, or JSONL); snippets around each term train its rows first, and a part "
                        "is held out to judge the published model on your text")
    parser.add_argument("--out", type=Path, required=True, help="folder to write; refused if it exists unless --force")
    parser.add_argument("--force", action="store_true", help="replace an existing --out folder")
    add_option_flags(parser)
    parser.add_argument("--keep-all-terms", dest="selection", action="store_const", const="none", default=argparse.SUPPRESS,
                        help="the same as --selection none: publish the last training step with every term")
    parser.add_argument("--work-dir", type=Path, help="checkpoint folder; rerunning with the same folder resumes")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a summary")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from app.settings import get_settings
    from extension.errors import InvalidOptionError
    from extension.pipeline import run
    from extension.plan.spec import ExtendSpec
    from extension.tokenizer import read_terms_file

    from .progress import TerminalProgress

    if args.terms is None and args.corpus is None:
        raise InvalidOptionError("give --terms FILE, --corpus FILE, or both", param="terms")
    spec = ExtendSpec(
        base_model=args.base_model,
        out_dir=args.out,
        terms=read_terms_file(args.terms) if args.terms else None,
        examples=_read_examples(args.examples, args.corpus_text_field) if args.examples else None,
        corpus_path=args.corpus,
        **option_values(args),
        corpus_name=str(args.corpus) if args.corpus else None,
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


def _read_examples(path: Path, text_field: str) -> list[str]:
    from extension.errors import InvalidCorpusError
    from extension.plan.corpus import iter_documents

    try:
        return list(iter_documents(path, text_field=text_field, label=f"examples {path}"))
    except InvalidCorpusError as exc:
        raise InvalidCorpusError(exc.message, param="examples") from None
