"""Encode throughput of extended tokenizers against their base, on the same few MB of text.

For each base tokenizer (SmolLM2: byte-level BPE; Gemma 3: SentencePiece-style BPE) and each
configuration — 300 or 5,000 new terms, added as BPE merges (mechanism "auto") or as added tokens
(mechanism "added_tokens") — the same documents are encoded with `encode_batch` on one thread,
every batch by all tokenizers back to back, so that load from other processes on this shared
machine hits them alike; CPU time of the encoding thread is summed over the rounds. Terms are
real: the most frequent FOLDOC words the base splits into 2+ pieces. Text: FOLDOC (computing
English) and Spanish and English fortunes, read from the installed Debian packages.

    .venv/bin/python benchmarks/tokenizer_speed.py            # writes benchmarks/results/tokenizer_speed.md
    .venv/bin/python benchmarks/tokenizer_speed.py --models smollm2 --rounds 2 --megabytes 1 --out /tmp/t.md
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import platform
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")
FORTUNES = [Path("/usr/share/games/fortunes/fortunes"), *sorted(Path("/usr/share/games/fortunes/es").glob("*.fortunes"))]
TARGET = 0.9


def load_text(megabytes: float) -> list[str]:
    """Documents (blank-line separated blocks) of FOLDOC and fortunes, about `megabytes` MB in all."""
    budget = int(megabytes * 1_000_000)
    fortunes = "\n".join(p.read_text(encoding="utf-8", errors="replace").replace("\n%\n", "\n\n") for p in FORTUNES)
    with gzip.open(FOLDOC, "rt", encoding="utf-8") as handle:
        foldoc = handle.read(max(budget - len(fortunes.encode()), budget // 2))
    documents = [d for d in re.split(r"\n\s*\n", foldoc + "\n\n" + fortunes) if d.strip()]
    out, size = [], 0
    for document in documents:
        out.append(document)
        size += len(document.encode())
        if size >= budget:
            break
    return out


def pick_terms(tokenizer, count: int) -> list[str]:
    """The `count` most frequent alphabetic FOLDOC words the tokenizer splits after a space."""
    with gzip.open(FOLDOC, "rt", encoding="utf-8") as handle:
        words = collections.Counter(re.findall(r"(?<![\w-])[A-Za-z]{4,}(?![\w-])", handle.read()))
    picked = []
    for word, _ in words.most_common():
        if len(tokenizer.tokenize(" " + word)) >= 2:
            picked.append(word)
            if len(picked) == count:
                break
    return picked


def batches(documents: list[str], size: int = 256) -> list[list[str]]:
    return [documents[start:start + size] for start in range(0, len(documents), size)]


def timed_rounds(backends: list, documents: list[str], rounds: int) -> tuple[list[list[float]], list[int]]:
    """Per tokenizer and round: CPU seconds of this thread to encode all documents; and tokens.

    Every batch is encoded by all tokenizers back to back (order rotated per batch), so a burst of
    load from other jobs on this shared machine hits them alike. Thread CPU time with tokenizers'
    parallelism off counts only the encoding itself."""
    parts = batches(documents)
    seconds = [[0.0] * rounds for _ in backends]
    tokens = [0] * len(backends)
    for round_number in range(rounds):
        for number, part in enumerate(parts):
            shift = (number + round_number) % len(backends)
            for index in list(range(len(backends)))[shift:] + list(range(len(backends)))[:shift]:
                started = time.thread_time()
                encodings = backends[index].encode_batch(part, add_special_tokens=False)
                seconds[index][round_number] += time.thread_time() - started
                if round_number == 0:
                    tokens[index] += sum(len(e.ids) for e in encodings)
    return seconds, tokens


def run(models: list[str], sizes: list[int], rounds: int, megabytes: float) -> str:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from extension.plan.models import ModelSources, resolve_model
    from extension.tokenizer import extend_tokenizer

    documents = load_text(megabytes)
    text_bytes = sum(len(d.encode()) for d in documents)
    sources = ModelSources(cache_dir=REPO / ".cache")
    paths = {
        "smollm2": lambda: resolve_model("smollm2-135m", sources).path,
        "gemma3": lambda: _gemma_tokenizer_dir(),
    }
    lines = [
        "# Tokenizer encode throughput: extended vs base",
        "",
        f"Command: `.venv/bin/python benchmarks/tokenizer_speed.py {' '.join(sys.argv[1:])}`".rstrip() + "  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"tokenizers {_version('tokenizers')}, transformers {_version('transformers')}  ",
        f"Text: {len(documents)} documents, {text_bytes / 1e6:.2f} MB (FOLDOC + English and Spanish fortunes), "
        f"`encode_batch` in batches of 256 on one thread; every batch encoded by all tokenizers back to back; "
        f"one warm-up pass, then {rounds} timed rounds.  ",
        f"Target: extended ≥ {TARGET}× the base tokenizer's throughput.",
        "",
        "| base | new terms | mechanism | terms as merges / added | new vocab entries | extend s "
        "| MB per CPU-s base | MB per CPU-s extended | ratio | per-round ratios | tokens/byte base → extended |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for model in models:
        base = AutoTokenizer.from_pretrained(paths[model]())
        terms = pick_terms(base, max(sizes))
        configs = []
        for size in sizes:
            for mechanism in ("auto", "added_tokens"):
                started = time.perf_counter()
                extended = extend_tokenizer(base, terms[:size], mechanism=mechanism)
                configs.append((size, mechanism, extended, time.perf_counter() - started))
                print(f"{model}: extended with {size} terms ({mechanism}) in {configs[-1][3]:.1f} s", flush=True)
        # Fresh copies built the same way: a BPE word cache never evicts, so the base tokenizer's
        # cache — already filled by picking the terms — would otherwise be slower than new ones.
        backends = [Tokenizer.from_str(t.backend_tokenizer.to_str())
                    for t in [base] + [extended.tokenizer for _, _, extended, _ in configs]]
        timed_rounds(backends, documents, 1)  # warm every BPE word cache alike before timing
        times, counts = timed_rounds(backends, documents, rounds)
        print(f"{model}: timed {rounds} rounds", flush=True)
        base_times, base_tokens = times[0], counts[0]
        for (size, mechanism, extended, extend_seconds), ext_times, tokens in zip(configs, times[1:], counts[1:]):
            by_mechanism = extended.to_json()["counts"]["terms_by_mechanism"]
            # Total over all rounds, and the spread of the per-round ratios.
            ratio = sum(base_times) / sum(ext_times)
            ratios = sorted(b / e for b, e in zip(base_times, ext_times))
            lines.append(
                f"| {model} | {size:,} | {'merges (auto)' if mechanism == 'auto' else 'added tokens'} | "
                f"{by_mechanism['merges']} / {by_mechanism['added_token']} | {len(extended.new_tokens):,} | "
                f"{extend_seconds:.1f} | {rounds * text_bytes / 1e6 / sum(base_times):.2f} | "
                f"{rounds * text_bytes / 1e6 / sum(ext_times):.2f} | "
                f"**{ratio:.2f}×**{'' if ratio >= TARGET else ' (below target)'} | {ratios[0]:.2f}–{ratios[-1]:.2f} | "
                f"{base_tokens / text_bytes:.4f} → {tokens / text_bytes:.4f} |"
            )
    lines += [
        "",
        "Throughput is text bytes per CPU-second of the encoding thread (tokenizers' parallelism off), so",
        "jobs sharing the machine skew it less. Ratio = extended / base throughput over all rounds on the",
        "same text (above 1: faster); the per-round ratios show how much rounds disagree on this shared machine.",
        "\"extend s\" is the wall time of `extend_tokenizer` itself. \"merges (auto)\" adds each term as BPE merges where",
        "they provably work and as a word-boundary added token otherwise; \"added tokens\" adds every",
        "term as one.",
    ]
    return "\n".join(lines) + "\n"


def _gemma_tokenizer_dir() -> str:
    target = REPO / ".cache" / "gemma3-270m-tokenizer"
    if not (target / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        from extension.plan.models import BUILTIN_MODELS, builtin_gguf

        gguf = builtin_gguf(BUILTIN_MODELS["gemma3-270m"], REPO / ".cache")
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(target)
    return str(target)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma3"], choices=["smollm2", "gemma3"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[300, 5000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--megabytes", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "tokenizer_speed.md")
    args = parser.parse_args()
    # One thread, the calling one: its CPU time is then exactly the encoding work.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    report = run(args.models, args.sizes, args.rounds, args.megabytes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report, encoding="utf-8")
    print(report)


if __name__ == "__main__":
    main()
