"""Mining quality and cost: tokens per byte on held-out domain text for the same number of new
vocabulary entries, ours vs the usual ways of choosing them; and the time and peak memory of
mining a 50 MB corpus.

Methods, all given the same training split (held-out documents are never seen) and the same
text cleaning (terminal escape codes and URLs cut out), all with the SmolLM2 tokenizer:
- ours: extension.mining (BPE continued on top of the base merges), default filters;
- ours, filters off: the same with every candidate filter off (for reference);
- domain BPE + difference (merges): train a BPE on the domain text with `tokenizers`' BpeTrainer
  (same pre-tokenizer, byte alphabet) and append its new tokens, in its merge order, as merges
  after the base merges (arXiv 2512.03989's "append the difference");
- domain BPE + difference (added tokens): the same strings added with tokenizer.add_tokens, as
  most fine-tuning recipes do;
- top words (merges): the train split's words ranked by tokens they would save
  ((pieces - 1) x frequency, same filters as ours), each made one token by a left-to-right chain
  of merges; intermediates count toward N like ours.
Every method gets at most N new entries; the table says how many it actually added and how many
of them are ever used on the held-out text.

Texts are read from Debian packages at run time: fortunes-es (Spanish), fortunes-zh (Chinese,
/usr/share/games/fortunes/chinese), dict-foldoc (English computing). The 50 MB corpus is built by
concatenating those texts with the English fortunes and Python's pydoc topics, repeated until it
reaches the size — so it has the distinct words of ~10 MB of text, which is what a word-count
based miner's memory depends on; the report says so.

    nice .venv/bin/python benchmarks/mining.py                 # everything (~20 min on 2 cores)
    nice .venv/bin/python benchmarks/mining.py --sizes 300 --domains foldoc --no-big
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FORTUNES = Path("/usr/share/games/fortunes")
FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")
DOMAINS = ("es", "zh", "foldoc")
SIZES = (300, 1000, 3000)
METHODS = ("ours", "bpe_diff_merges", "bpe_diff_added", "top_words", "ours_unfiltered", "bpe_diff_merges_unfiltered")
# which method each one is compared with in the ratio column (filters on vs on, off vs off)
REFERENCE = {m: "ours" for m in METHODS} | {"bpe_diff_merges_unfiltered": "ours_unfiltered", "ours_unfiltered": None, "ours": None}
LABELS = {
    "ours": "ours (BPE continuation)",
    "ours_unfiltered": "ours, digit/punctuation filters off",
    "bpe_diff_merges": "domain BPE + difference, as merges",
    "bpe_diff_added": "domain BPE + difference, as added tokens",
    "top_words": "top-N words (merge chains)",
    "bpe_diff_merges_unfiltered": "domain BPE + difference, as merges, no filters",
}


# --- texts --------------------------------------------------------------------------------------


def fortune_documents(paths: list[Path]) -> list[str]:
    docs = []
    for path in paths:
        for entry in re.split(r"(?m)^%\s*$", path.read_text(encoding="utf-8")):
            entry = re.sub(r"\n\s*\n", "\n", entry).strip("\n")
            if entry.strip():
                docs.append(entry)
    return docs


def domain_documents(name: str) -> list[str]:
    if name == "es":
        return fortune_documents(sorted(p for p in (FORTUNES / "es").iterdir() if p.is_file() and p.suffix == ".fortunes"))
    if name == "zh":
        return fortune_documents([FORTUNES / "chinese"])
    if name == "foldoc":
        with gzip.open(FOLDOC, "rt", encoding="utf-8") as handle:
            return [block.strip("\n") for block in re.split(r"\n\s*\n", handle.read()) if block.strip()]
    raise ValueError(name)


def write_corpus(path: Path, docs: list[str]) -> Path:
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


# --- baselines ----------------------------------------------------------------------------------


def train_domain_bpe(tokenizer, segments: list[str], vocab_size: int) -> list[tuple[str, str]]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    base = tokenizer.backend_tokenizer
    domain = Tokenizer(models.BPE())
    domain.normalizer = base.normalizer
    domain.pre_tokenizer = base.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=3, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    domain.train_from_iterator(segments, trainer)
    return [tuple(pair) for pair in json.loads(domain.to_str())["model"]["merges"]]


def difference_merges(view, domain_merges: list[tuple[str, str]], n: int, filters=None) -> list[tuple[str, str]]:
    """The domain merges whose result the base vocabulary lacks, in the domain's merge order.

    With `filters`, a result the miner would refuse is dropped, and so is every later merge built
    on a dropped result (it could never fire).
    """
    out, made, dropped = [], set(), set()
    for left, right in domain_merges:
        token = left + right
        if view.token_id(token) is not None:
            continue
        if left in dropped or right in dropped or (filters and filters.reject_reason(view.token_bytes(token))):
            dropped.add(token)
            continue
        out.append((left, right))
        made.add(token)
        if len(out) == n:
            break
    return out


def top_word_merges(view, counts: Counter, filters, n: int) -> list[tuple[str, str]]:
    """Words ranked by (pieces - 1) x frequency; each becomes one token by a left-to-right chain."""
    scored = []
    for word, freq in counts.items():
        pieces = [token for _, token in view.pieces(word)]
        if len(pieces) < 2 or not all(view.mergeable(p) for p in pieces):
            continue
        if filters.reject_reason(view.token_bytes(word)):
            continue
        scored.append(((len(pieces) - 1) * freq, word, pieces))
    scored.sort(key=lambda item: (-item[0], item[1]))
    merges: list[tuple[str, str]] = []
    made: set[str] = set()
    for _score, _word, pieces in scored:
        chain, current = [], pieces[0]
        for piece in pieces[1:]:
            joined = current + piece
            if joined not in made:
                if view.token_id(joined) is not None:  # already a base token: no new merge can make it
                    chain = None
                    break
                chain.append((current, piece))
            current = joined
        if chain is None:
            continue
        if len(merges) + len(chain) > n:
            if len(merges) >= n:
                break
            continue
        for left, right in chain:
            merges.append((left, right))
            made.add(left + right)
    return merges


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --- measurement --------------------------------------------------------------------------------


def tokens(backend, docs: list[str]) -> tuple[int, Counter]:
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    total, used = 0, Counter()
    for start in range(0, len(docs), 512):
        for enc in encode(docs[start : start + 512], add_special_tokens=False):
            total += len(enc.ids)
            used.update(enc.ids)
    return total, used


def evaluate(base_size: int, backend, held: list[str], held_bytes: int, added: int, base_tokens: list[int]) -> dict:
    total, used = tokens(backend, held)
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    longer = sum(
        len(enc.ids) > before
        for enc, before in zip(encode(held, add_special_tokens=False), base_tokens)
    )
    return {
        "added": added,
        "used_on_held_out": sum(1 for i in used if i >= base_size),
        "tokens_per_byte": total / held_bytes,
        "held_out_tokens": total,
        "held_out_docs_longer": longer,
    }


def run_domain(name: str, sizes: list[int], tokenizer, workdir: Path, log) -> dict:
    from transformers import AutoTokenizer

    from extension.plan.corpus import is_held_out, iter_documents
    from extension.mining import MiningFilters, mine_terms
    from extension.mining.miner import count_words
    from extension.mining.vocabulary import TokenizerView
    from extension.tokenizer import extend_with_merges

    path = write_corpus(workdir / f"{name}.txt", domain_documents(name))
    docs = list(iter_documents(path))  # exactly the documents the miner reads
    held = [d for d in docs if is_held_out(d)]
    train = [d for d in docs if not is_held_out(d)]
    held_bytes = sum(len(d.encode("utf-8")) for d in held)
    base = tokenizer.backend_tokenizer
    base_size = len(tokenizer)
    encode = getattr(base, "encode_batch_fast", base.encode_batch)
    base_tokens = [len(e.ids) for e in encode(held, add_special_tokens=False)]
    result = {
        "documents": len(docs), "train_documents": len(train), "held_out_documents": len(held),
        "bytes": sum(len(d.encode("utf-8")) for d in docs), "held_out_bytes": held_bytes,
        "base_tokens_per_byte": sum(base_tokens) / held_bytes, "sizes": {},
    }
    filters = MiningFilters()
    view = TokenizerView(tokenizer)
    segments = [seg for doc in train for seg in filters.clean_segments(doc)]
    started = time.perf_counter()
    domain_merges = train_domain_bpe(tokenizer, segments, vocab_size=256 + 6 * max(sizes))
    bpe_seconds = time.perf_counter() - started
    counts, _stats = count_words(view, train, filters, None)
    log(f"[{name}] {len(docs)} docs, domain BPE {len(domain_merges)} merges in {bpe_seconds:.1f}s")

    for n in sizes:
        row = {}
        for method, method_filters in (("ours", MiningFilters()), ("ours_unfiltered", MiningFilters(digits=False, punctuation=False))):
            started = time.perf_counter()
            mined = mine_terms(tokenizer, path, max_new_tokens=n, filters=method_filters)
            seconds = time.perf_counter() - started
            row[method] = {
                **evaluate(base_size, mined.extended.tokenizer.backend_tokenizer, held, held_bytes, len(mined.merges), base_tokens),
                "seconds": round(seconds, 2),
                "guarantee_passed": mined.report["guarantee"]["passed"],
                "documents_checked": mined.report["guarantee"]["documents_checked"],
            }
        diff = difference_merges(view, domain_merges, n, filters)
        extended = extend_with_merges(tokenizer, diff)
        row["bpe_diff_merges"] = evaluate(base_size, extended.tokenizer.backend_tokenizer, held, held_bytes, len(diff), base_tokens)
        # Added tokens are text: byte strings that are not whole UTF-8 characters cannot be added.
        strings = [view.token_bytes(left + right) for left, right in diff]
        added_tok = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
        added = added_tok.add_tokens([b.decode("utf-8") for b in strings if _is_utf8(b)])
        row["bpe_diff_added"] = evaluate(base_size, added_tok.backend_tokenizer, held, held_bytes, added, base_tokens)
        chain = top_word_merges(view, counts, filters, n)
        extended = extend_with_merges(tokenizer, chain)
        row["top_words"] = evaluate(base_size, extended.tokenizer.backend_tokenizer, held, held_bytes, len(chain), base_tokens)
        diff = difference_merges(view, domain_merges, n)
        extended = extend_with_merges(tokenizer, diff)
        row["bpe_diff_merges_unfiltered"] = evaluate(base_size, extended.tokenizer.backend_tokenizer, held, held_bytes, len(diff), base_tokens)
        result["sizes"][n] = row
        log(f"[{name}] N={n}: " + ", ".join(f"{m} {row[m]['tokens_per_byte']:.4f} ({row[m]['added']})" for m in METHODS))
    return result


# --- the 50 MB corpus ---------------------------------------------------------------------------


def build_big_corpus(path: Path, megabytes: int) -> dict:
    import pydoc_data.topics

    parts = {name: domain_documents(name) for name in DOMAINS}
    parts["fortunes-en"] = fortune_documents([FORTUNES / "fortunes"])
    parts["pydoc-topics"] = [t.strip("\n") for t in pydoc_data.topics.topics.values() if t.strip()]
    one_copy = "\n\n".join("\n\n".join(re.sub(r"\n\s*\n", "\n", d) for d in docs) for docs in parts.values()) + "\n\n"
    copy_bytes = len(one_copy.encode("utf-8"))
    copies = -(-megabytes * 1_000_000 // copy_bytes)
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(copies):
            handle.write(one_copy)
    return {"sources": {k: len(v) for k, v in parts.items()}, "copy_bytes": copy_bytes, "copies": copies, "bytes": path.stat().st_size}


def big_child(path: str, max_new_tokens: int) -> None:
    """Run in a fresh process so its peak RSS is the miner's alone."""
    from transformers import AutoTokenizer

    from extension.mining import mine_terms

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir()))
    loaded_rss = _status_mb("VmHWM")
    load_before = os.getloadavg()
    started = time.perf_counter()
    cpu_started = time.process_time()
    result = mine_terms(tokenizer, path, max_new_tokens=max_new_tokens)
    print(json.dumps({
        "seconds": round(time.perf_counter() - started, 1),
        "cpu_seconds": round(time.process_time() - cpu_started, 1),
        "load_average_before_after": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
        "phases": result.report["seconds"],
        "peak_rss_mb": _status_mb("VmHWM"),
        "rss_after_tokenizer_load_mb": loaded_rss,
        "corpus": result.report["corpus"],
        "new_tokens": result.report["new_tokens"],
        "guarantee": {k: v for k, v in result.report["guarantee"].items() if k != "examples"},
        "held_out": result.report["held_out"],
    }))


def _status_mb(field: str) -> float:
    """A memory figure of this process image from /proc (VmHWM = peak RSS). Unlike getrusage's
    ru_maxrss, VmHWM is not inherited from the parent across fork + exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    raise KeyError(field)


def smollm2_dir() -> Path:
    from extension.plan.models import ModelSources, resolve_model

    return Path(resolve_model("smollm2-135m", ModelSources(cache_dir=REPO / ".cache")).path)


# --- report -------------------------------------------------------------------------------------


def markdown(results: dict, big: dict | None, env: dict) -> str:
    lines = [
        "# Mining benchmark",
        "",
        f"Produced by `benchmarks/mining.py` on {env['when']} ({env['machine']}). Tokenizer: "
        "SmolLM2-135M (byte-level BPE, 49,152 tokens). Lower tokens per byte on the held-out split "
        "(documents no method saw) is better; **saving** = 1 - after/before. "
        "`added` = new vocabulary entries actually added (intermediates included), `used` = how many "
        "of them occur at least once in the held-out encoding, `longer` = held-out documents that "
        "encode longer than with the base tokenizer.",
        "",
    ]
    for name, data in results.items():
        lines.append(f"## {name}: {data['documents']} documents, {data['bytes'] / 1e6:.2f} MB "
                     f"({data['held_out_documents']} held out, {data['held_out_bytes'] / 1e3:.0f} kB); "
                     f"base {data['base_tokens_per_byte']:.4f} tokens/byte")
        lines.append("")
        lines.append("| N | method | added | used | tokens/byte | saving | longer | ours' saving / this one's |")
        lines.append("|---:|---|---:|---:|---:|---:|---:|---:|")
        for n, row in data["sizes"].items():
            for method in METHODS:
                cell = row[method]
                saving = 1 - cell["tokens_per_byte"] / data["base_tokens_per_byte"]
                reference = REFERENCE[method]
                if reference is None:
                    ratio = "—"
                else:
                    ours_saving = 1 - row[reference]["tokens_per_byte"] / data["base_tokens_per_byte"]
                    ratio = f"{ours_saving / saving:.2f}x" if saving > 0 else "ours saves, this does not"
                lines.append(
                    f"| {n} | {LABELS[method]} | {cell['added']} | {cell['used_on_held_out']} | "
                    f"{cell['tokens_per_byte']:.4f} | {100 * saving:.2f}% | {cell['held_out_docs_longer']} | {ratio} |"
                )
        lines.append("")
    if big:
        info = big["corpus_build"]
        child = big["result"]
        lines += [
            "## Mining time and peak memory, 50 MB corpus",
            "",
            f"Corpus: {info['bytes'] / 1e6:.1f} MB built by concatenating fortunes-es, fortunes-zh, "
            f"dict-foldoc, the English fortunes and Python's pydoc topics ({info['copy_bytes'] / 1e6:.2f} MB) "
            f"{info['copies']} times — so only ~{info['copy_bytes'] / 1e6:.0f} MB of it is distinct text "
            f"({child['corpus']['distinct_words']} distinct words); a real 50 MB corpus has more distinct "
            "words, and the word Counter (the miner's main memory) grows with them, not with the bytes.",
            "",
            f"- max_new_tokens {child['new_tokens']}, one process ({env['machine']}); the machine was "
            f"shared: load average {child['load_average_before_after'][0]} before, "
            f"{child['load_average_before_after'][1]} after",
            f"- total {child['seconds']} s wall, {child['cpu_seconds']} s CPU in the process: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in child["phases"].items()),
            f"- peak RSS {child['peak_rss_mb']:.0f} MB (peak after loading the tokenizer, before mining: "
            f"{child['rss_after_tokenizer_load_mb']:.0f} MB); the corpus file is {info['bytes'] / 1e6:.0f} MB",
            f"- documents checked (no-longer guarantee): {child['guarantee']['documents_checked']}, "
            f"longer: {child['guarantee']['documents_longer']}",
            f"- held-out tokens/byte {child['held_out']['tokens_per_byte_before']:.4f} -> "
            f"{child['held_out']['tokens_per_byte_after']:.4f}",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domains", nargs="+", default=list(DOMAINS), choices=DOMAINS)
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--big-mb", type=int, default=50)
    parser.add_argument("--no-big", action="store_true", help="skip the 50 MB time/memory run")
    parser.add_argument("--big-only", action="store_true", help="only the 50 MB run; keep the domain results already in --out's .json")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "mining.md")
    parser.add_argument("--big-child", help=argparse.SUPPRESS)
    parser.add_argument("--big-max-new-tokens", type=int, default=300)
    args = parser.parse_args()
    if args.big_child:
        big_child(args.big_child, args.big_max_new_tokens)
        return

    from transformers import AutoTokenizer

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    env = {"when": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"}
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir()))
    results = {}
    if args.big_only:  # keep the committed domain tables, redo the 50 MB measurement
        results = json.loads(args.out.with_suffix(".json").read_text(encoding="utf-8"))["domains"]
    with tempfile.TemporaryDirectory(prefix="tide-mining-bench-") as tmp:
        workdir = Path(tmp)
        for name in [] if args.big_only else args.domains:
            results[name] = run_domain(name, args.sizes, tokenizer, workdir, log)
        big = None
        if not args.no_big:
            corpus = workdir / "big.txt"
            build = build_big_corpus(corpus, args.big_mb)
            log(f"[big] {build['bytes'] / 1e6:.1f} MB corpus, mining in a child process")
            out = subprocess.run(
                [sys.executable, __file__, "--big-child", str(corpus), "--big-max-new-tokens", str(args.big_max_new_tokens)],
                check=True, capture_output=True, text=True,
            )
            big = {"corpus_build": build, "result": json.loads(out.stdout.strip().splitlines()[-1])}
            log(f"[big] {big['result']['seconds']} s, peak RSS {big['result']['peak_rss_mb']} MB")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(results, big, env), encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps({"env": env, "domains": results, "big": big}, indent=1, default=str), encoding="utf-8")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
