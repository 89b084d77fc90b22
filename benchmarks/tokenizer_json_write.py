"""Writing the extended tokenizer.json: through the JSON structure (what extension/tokenizer does)
against splicing the new entries into the base file's text (what it did before), on the real
tokenizers.

For each base (SmolLM2: 49k vocab; Gemma 3: 262k vocab) and 300 or 5,000 new terms (the most
frequent FOLDOC words the base splits, as in tokenizer_speed.py), this times the whole
`extend_tokenizer` call and counts its builds (one tokenizer.json written and loaded each), then
times both ways of writing that extension's tokenizer.json, checks that they give the same
tokenizer, and sets the difference against the whole call. CPU time of the process, best of
--repeats.

    .venv/bin/python benchmarks/tokenizer_json_write.py     # writes benchmarks/results/tokenizer_json_write.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import tokenizer_speed  # noqa: E402


COLUMNS = [
    "base", "tokenizer.json MB", "new terms", "new vocab entries", "builds", "extend_tokenizer CPU-s",
    "write: JSON CPU-s", "write: splice CPU-s", "load CPU-s", "difference CPU-s", "difference / extend",
]
NOTES = """\
"builds" is how many times `extend_tokenizer` wrote and loaded a tokenizer.json for that
extension; "difference" = builds × (JSON write − splice write), the time the splice would save
in that call; "extend_tokenizer" is the whole call with the JSON writer; "load" is reading the
written tokenizer.json into a transformers tokenizer, which every build does. Times are CPU seconds
of this process (all its threads), best of the repeats, so other jobs on a shared machine skew them less.
"""


def spliced_tokenizer_json(base_json: str, vocab: dict, merges: list, added_tokens: dict) -> str | None:
    """The replaced writer: new entries inserted into the text at places found by the serializer's
    key order (`added_tokens` before `normalizer`; `vocab` then `merges` closing `model`, which
    closes the file). None when the text is not laid out that way."""
    from extension.tokenizer.tokenizer_json import added_token_entry

    def dumps(value) -> str:
        return json.dumps(value, ensure_ascii=False)

    vocab_end = base_json.rfind('},"merges":[')
    added_start = base_json.find('"added_tokens":[')
    added_end = base_json.find('],"normalizer":', added_start)
    if vocab_end < 0 or added_start < 0 or added_end < 0 or not base_json.endswith("]}}"):
        return None
    merge_items = [dumps([left, right]) for left, right in merges]
    vocab_items = [f"{dumps(string)}:{token_id}" for string, token_id in vocab.items()]
    added_items = [dumps(added_token_entry(content, token_id)) for content, token_id in added_tokens.items()]

    def joined(items: list[str], after: str) -> str:
        return ("" if after in "[{" else ",") + ",".join(items) if items else ""

    merges_end = len(base_json) - 3
    return (
        base_json[:added_end] + joined(added_items, base_json[added_end - 1])
        + base_json[added_end:vocab_end] + joined(vocab_items, base_json[vocab_end - 1])
        + base_json[vocab_end:merges_end] + joined(merge_items, base_json[merges_end - 1])
        + base_json[merges_end:]
    )


def best_seconds(function, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.process_time()
        result = function()
        best = min(best, time.process_time() - started)
    return best, result


def counting_builds():
    """Count the tokenizer builds (one tokenizer.json write each) inside extend_tokenizer."""
    from extension.tokenizer import extend as extend_module

    calls = [0]
    original = extend_module.build_tokenizer

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    extend_module.build_tokenizer = counted
    return calls


def run(models: list[str], sizes: list[int], repeats: int) -> str:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from extension.plan.models import ModelSources, resolve_model
    from extension.tokenizer import extend_tokenizer
    from extension.tokenizer.tokenizer_json import extended_tokenizer_json, load_like

    paths = {
        "smollm2": lambda: resolve_model("smollm2-135m", ModelSources(cache_dir=REPO / ".cache")).path,
        "gemma3": tokenizer_speed._gemma_tokenizer_dir,
    }
    builds = counting_builds()
    command = " ".join([".venv/bin/python", "benchmarks/tokenizer_json_write.py", *sys.argv[1:]])
    versions = ", ".join(f"{name} {tokenizer_speed._version(name)}" for name in ("tokenizers", "transformers"))
    lines = [
        "# Writing tokenizer.json: JSON structure vs text splice",
        "",
        f"Command: `{command}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {versions}  ",
        f"Each call timed {repeats} times, best shown; both writers give the same tokenizer in every row.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "| --- |" + " ---: |" * (len(COLUMNS) - 1),
    ]
    for model in models:
        base = AutoTokenizer.from_pretrained(paths[model]())
        base_json = base.backend_tokenizer.to_str()
        terms = tokenizer_speed.pick_terms(base, max(sizes))
        for size in sizes:
            builds[0] = 0
            extend_seconds, extended = best_seconds(lambda: extend_tokenizer(base, terms[:size]), repeats)
            build_count = builds[0] // repeats
            added = {t.term: t.forms[t.term] for t in extended.terms if t.mechanism == "added_token"}
            vocab = {t.token: t.id for t in extended.new_tokens if t.id not in added.values()}
            merges = list(extended.merges)
            json_seconds, via_json = best_seconds(
                lambda: extended_tokenizer_json(base_json, vocab, merges, added), repeats)
            splice_seconds, via_splice = best_seconds(
                lambda: spliced_tokenizer_json(base_json, vocab, merges, added), repeats)
            if via_splice is None or Tokenizer.from_str(via_json).to_str() != Tokenizer.from_str(via_splice).to_str():
                raise SystemExit(f"{model}, {size} terms: the two writers disagree")
            load_seconds, _ = best_seconds(lambda: load_like(base, via_json), repeats)
            difference = build_count * (json_seconds - splice_seconds)
            lines.append(
                f"| {model} | {len(base_json.encode()) / 1e6:.1f} | {size:,} | {len(extended.new_tokens):,} | "
                f"{build_count} | {extend_seconds:.2f} | {json_seconds:.3f} | {splice_seconds:.3f} | {load_seconds:.3f} | "
                f"{difference:.3f} | {difference / extend_seconds:.1%} |"
            )
            print(lines[-1], flush=True)
    return "\n".join(lines) + "\n\n" + NOTES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma3"], choices=["smollm2", "gemma3"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[300, 5000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "tokenizer_json_write.md")
    args = parser.parse_args()
    report = run(args.models, args.sizes, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report, encoding="utf-8")
    print(report)


if __name__ == "__main__":
    main()
