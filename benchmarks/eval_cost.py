"""What evaluation costs, and what batching and the base-score cache save (issue 12, item 4).

Part 1, the evaluate stage alone, on the same text and model, variants interleaved per repetition:
  unbatched          one chunk per forward (batch_tokens=1), no cache: before + after
  batched            several chunks per forward (the device's batch, 4096 tokens on a CPU), no cache
  batched + cache    batched, the base model's scores read from a warm cache (extension/evaluation/score_cache.py):
                     only the extended model is scored
Each variant's time is the median of --reps repetitions; ratios are to "unbatched".

Part 2, whole jobs: the same corpus job (the model, the terms of examples/terms.txt, a FOLDOC corpus)
run twice through extension.pipeline.run with one cache folder — the first with a cold score
cache, the second with a warm one — with each stage's seconds and the evaluate stage's share.

    nice -n 10 .venv/bin/python benchmarks/eval_cost.py                      # SmolLM2, writes results
    .venv/bin/python benchmarks/eval_cost.py --model PATH --eval-bytes 2000 --reps 1 --steps 1 --out /tmp/x.md  # smoke

These machines are shared and noisy: read the ratios, not the absolute seconds.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import re
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")
VARIANTS = ("unbatched", "batched", "batched + cache")


def foldoc_documents(skip: int, count: int) -> list[str]:
    """FOLDOC entries (headword + dedented body), read from the installed dict-foldoc package."""
    with gzip.open(FOLDOC, "rt", encoding="utf-8") as handle:
        raw = handle.read(8_000_000)
    entries = re.split(r"\n(?=\S)", raw)[skip : skip + count]
    return [textwrap.dedent(entry).strip() for entry in entries if len(entry.strip()) > 80]


def model_path(name: str, cache_dir: Path) -> str:
    if name == "smollm2":
        from extension.plan.models import ModelSources, resolve_model

        return resolve_model("smollm2-135m", ModelSources(cache_dir=cache_dir)).path
    return name


def extended_model(base, tokenizer, terms: list[str]):
    """The base model with the terms' rows applied (subword means): what 'after' scores."""
    from extension.rows.init import apply_rows, subword_mean_rows
    from extension.tokenizer import extend_tokenizer

    extended = extend_tokenizer(tokenizer, terms)
    model = copy.deepcopy(base)
    rows = subword_mean_rows(model, extended.new_tokens, extended.base_vocab_size)
    apply_rows(model, rows, base_vocab_size=extended.base_vocab_size)
    return model, extended


def part1(args, path: str) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from extension.plan.devices import eval_batch_tokens
    from extension.evaluation import evaluate_model, load_general_text
    from extension.evaluation.score_cache import ScoreCache
    from extension.tokenizer import read_terms_file

    base = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    after_model, extended = extended_model(base, tokenizer, read_terms_file(REPO / "examples" / "terms.txt"))
    new_ids = [t.id for t in extended.new_tokens]
    domain = foldoc_documents(skip=3000, count=400)
    general = load_general_text()
    cache_dir = Path(tempfile.mkdtemp(prefix="tide-eval-cost-"))

    def stage(variant: str) -> tuple[float, float, dict, dict]:
        batch = 1 if variant == "unbatched" else None
        cache = ScoreCache.for_model(cache_dir, base) if variant == "batched + cache" else None
        began = time.perf_counter()
        before = evaluate_model(base, tokenizer, domain, general, max_bytes=args.eval_bytes, batch_tokens=batch, score_cache=cache)
        middle = time.perf_counter()
        after = evaluate_model(after_model, extended.tokenizer, domain, general, new_token_ids=new_ids,
                               max_bytes=args.eval_bytes, batch_tokens=batch)
        ended = time.perf_counter()
        if cache is not None:
            assert cache.report() == {"hits": 2, "misses": 0}, cache.report()
        return middle - began, ended - middle, before, after

    # Fill the cache once (this run is the "batched, cold cache" case, and not timed).
    warm = ScoreCache.for_model(cache_dir, base)
    reference = evaluate_model(base, tokenizer, domain, general, max_bytes=args.eval_bytes, score_cache=warm)
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    results: dict[str, tuple[dict, dict]] = {}
    for rep in range(args.reps):
        order = VARIANTS[rep % 3:] + VARIANTS[: rep % 3]
        for variant in order:
            before_s, after_s, before, after = stage(variant)
            times[variant].append((before_s, after_s))
            results[variant] = (before, after)
            print(f"rep {rep + 1} {variant}: before {before_s:.2f} s, after {after_s:.2f} s", flush=True)
    same = {v: abs(results[v][0]["domain"]["bits_per_byte"] - reference["domain"]["bits_per_byte"]) for v in VARIANTS}
    chunks = reference["domain"]["chunks"] + reference["general"]["chunks"]
    return {"times": times, "bits_per_byte_difference": same, "chunks": chunks, "batch_tokens": eval_batch_tokens(base),
            "bytes": {"domain": reference["domain"]["bytes"], "general": reference["general"]["bytes"]},
            "new_rows": len(new_ids)}


def part2(args, path: str) -> list[dict]:
    from extension.plan.models import ModelSources
    from extension.pipeline import run
    from extension.plan.spec import ExtendSpec
    from extension.tokenizer import read_terms_file

    folder = Path(tempfile.mkdtemp(prefix="tide-eval-job-"))
    corpus = folder / "foldoc.txt"
    corpus.write_text("\n\n".join(foldoc_documents(skip=0, count=args.corpus_entries)), encoding="utf-8")
    sources = ModelSources(cache_dir=folder / "cache")
    jobs = []
    for run_name in ("cold cache", "warm cache"):
        spec = ExtendSpec(base_model=path, out_dir=folder / run_name.replace(" ", "-"), terms=read_terms_file(REPO / "examples" / "terms.txt"),
                          corpus_path=corpus, steps=args.steps, eval_max_bytes=args.eval_bytes, device="cpu", force=True)
        began = time.perf_counter()
        result = run(spec, sources=sources)
        total = time.perf_counter() - began
        jobs.append({"run": run_name, "seconds": result.seconds, "total": round(total, 2),
                     "cache": result.metrics["evaluation_cache"]["before"],
                     "domain_bits_per_byte_before": result.metrics["before"]["domain"]["bits_per_byte"]})
        print(f"job {run_name}: {result.seconds} total {total:.1f} s", flush=True)
    return jobs


def report(args, one: dict, jobs: list[dict]) -> str:
    med = {v: (statistics.median(b for b, _ in one["times"][v]), statistics.median(a for _, a in one["times"][v])) for v in VARIANTS}
    stage = {v: med[v][0] + med[v][1] for v in VARIANTS}
    lines = [
        "# What evaluation costs: batching and the base-score cache",
        "",
        f"Command: `{' '.join(['.venv/bin/python', 'benchmarks/eval_cost.py', *sys.argv[1:]])}`",
        "",
        f"CPU only (torch {torch.__version__}, {torch.get_num_threads()} threads), fp32, model `{args.model}`. "
        f"Evaluation text: {one['bytes']['domain']:,} bytes of held-out FOLDOC and {one['bytes']['general']:,} bytes of "
        f"general English, {one['chunks']} chunks of at most 1024 bytes; the extended model has {one['new_rows']} new rows "
        f"(examples/terms.txt). Batched = {one['batch_tokens']} tokens per forward (the CPU's batch). Median of "
        f"{args.reps} repetitions, variants interleaved. The machine is shared (2 cores, other jobs running): "
        "read the ratios.",
        "",
        "## The evaluate stage (base model before + extended model after)",
        "",
        "| variant | before (s) | after (s) | evaluate stage (s) | x unbatched |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for v in VARIANTS:
        lines.append(f"| {v} | {med[v][0]:.2f} | {med[v][1]:.2f} | {stage[v]:.2f} | {stage[v] / stage['unbatched']:.2f} |")
    lines += [
        "",
        f"Batched vs unbatched: {stage['batched'] / stage['unbatched']:.2f}x the stage time; the warm cache then takes "
        f"the stage to {stage['batched + cache'] / stage['batched']:.2f}x of batched ({stage['batched + cache'] / stage['unbatched']:.2f}x "
        f"of unbatched): the base model is not run at all. Domain bits per byte differ from the uncached batched "
        "score by at most " + f"{max(one['bits_per_byte_difference'].values()):.2e}" + " across the variants "
        "(the cache returns the stored numbers exactly; unbatched forwards round differently).",
        "",
        "## Whole jobs: the evaluate stage's share",
        "",
        f"The same corpus job twice (`{args.model}` + the terms of examples/terms.txt, a {args.corpus_entries}-entry FOLDOC corpus, "
        f"{args.steps} steps x batch 4 x 128, --eval-bytes {args.eval_bytes}), one score cache folder:",
        "",
        "| run | " + " | ".join(jobs[0]["seconds"]) + " | total (s) | evaluate share | base scores from cache |",
        "| --- | " + " | ".join("---:" for _ in jobs[0]["seconds"]) + " | ---: | ---: | --- |",
    ]
    for job in jobs:
        seconds = job["seconds"]
        share = seconds.get("evaluate", 0) / sum(seconds.values())
        lines.append(f"| {job['run']} | " + " | ".join(f"{seconds[k]:.2f}" for k in jobs[0]["seconds"])
                     + f" | {job['total']:.2f} | {share * 100:.1f}% | {job['cache']['hits']} of {job['cache']['hits'] + job['cache']['misses']} |")
    cold, warm = jobs
    lines += [
        "",
        f"With a warm cache the evaluate stage takes {warm['seconds']['evaluate'] / cold['seconds']['evaluate']:.2f}x its cold time "
        f"and the job {warm['total'] / cold['total']:.2f}x; the base model's domain bits per byte are identical "
        f"({cold['domain_bits_per_byte_before']:.6f} both times: {cold['domain_bits_per_byte_before'] == warm['domain_bits_per_byte_before']}).",
        "",
        "Raw stage times (before, after) per repetition (s):",
        "",
    ]
    for v in VARIANTS:
        lines.append(f"- {v}: " + ", ".join(f"({b:.2f}, {a:.2f})" for b, a in one["times"][v]))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2", help="smollm2, or a saved model folder (smoke runs)")
    parser.add_argument("--eval-bytes", type=int, default=20_000, help="bytes of domain text, and of general text")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="training steps of the whole jobs (part 2)")
    parser.add_argument("--corpus-entries", type=int, default=3000)
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "eval_cost.md")
    args = parser.parse_args()
    path = model_path(args.model, args.cache_dir)
    one = part1(args, path)
    jobs = part2(args, path)
    text = report(args, one, jobs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps({"part1": one, "jobs": jobs}, indent=2), encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
