"""The published model, scored as the user gets it (issue 37 item 4).

A job on a CPU or GPU that computes bf16 in hardware (precision 'auto') scores its before/after
on the model computing in bf16, while the folder it publishes holds the checkpoint's own fp32
weights. The card, the CLI summary and tide_extension.json say so; this script measures what that
costs once: one real corpus job through `extension.pipeline.run` on the built-in SmolLM2 at a
small budget, then the published folder and the base checkpoint loaded again and scored on the
same test split and general English, each in fp32 and in bf16 (extension.evaluation.evaluate_model,
the evaluate stage's own scorer), beside the job's own figures.

The domain's documents, its split and the job runner are benchmarks/quality_selection.py's.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/published_precision.py --domain es --steps 20 --eval-bytes 20000
    python benchmarks/published_precision.py --domain es --steps 2 --eval-bytes 3000 --max-docs 1500 --out /tmp/pp.md  # smoke
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

import quality_selection as qs  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def score_folder(path: str | Path, dtype: torch.dtype, test_docs: list[str], eval_bytes: int,
                 new_token_ids: list[int] | None) -> dict:
    """A model folder loaded as a user loads it, cast to `dtype`, scored as the evaluate stage scores."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from extension.evaluation import evaluate_model, load_general_text

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    model.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return evaluate_model(model, tokenizer, test_docs, load_general_text(), new_token_ids=new_token_ids, max_bytes=eval_bytes)


def figures(metrics: dict) -> dict:
    """The figures a card shows, from one evaluate_model result."""
    return {"domain_bits_per_byte": metrics["domain"]["bits_per_byte"], "general_bits_per_byte": metrics["general"]["bits_per_byte"],
            "domain_tokens_per_byte": metrics["domain"]["tokens_per_byte"], "dtype": metrics["settings"].get("dtype")}


def main() -> None:
    from extension.plan.models import ModelSources, resolve_model
    from extension.plan.spec import ExtendSpec

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domain", choices=list(qs.DOMAINS), default="es")
    parser.add_argument("--steps", type=int, default=20, help="the job's training steps (a small budget: the point is the scoring)")
    parser.add_argument("--eval-bytes", type=int, default=20_000, help="test-split bytes scored, and general-English bytes")
    parser.add_argument("--selection", choices=("none", "validation"), default="none",
                        help="the job's selection: none (every mined token, the last step; a small budget's job may "
                             "otherwise publish nothing, and what is scored, not what is chosen, is the question) or validation")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--max-docs", type=int, default=0, help="smoke runs only: the first N documents (0: all)")
    parser.add_argument("--out", type=Path, help="default benchmarks/results/published_precision.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cache = REPO / ".cache"
    out = args.out or RESULTS / "published_precision.md"
    started = time.time()

    def log(message: str) -> None:
        print(f"[{time.time() - started:6.0f}s] {args.domain}: {message}", file=sys.stderr, flush=True)

    docs = qs.documents(args.domain)[: args.max_docs or None]
    splits, data = qs.split_sizes(docs)
    result = {"command": "nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/published_precision.py "
                         + " ".join(sys.argv[1:]),
              "domain": args.domain, "steps": args.steps, "selection": args.selection, "eval_bytes": args.eval_bytes, "data": data,
              "cpu_kind": qs.CPU_KIND}
    work = Path(tempfile.mkdtemp(prefix=f"tide_published_precision_{args.domain}_"))
    try:
        corpus = work / f"{args.domain}.jsonl"
        corpus.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
        spec = ExtendSpec(base_model="smollm2-135m", out_dir=str(work / "published"), corpus_path=corpus,
                          corpus_name=args.domain, eval_max_bytes=args.eval_bytes, steps=args.steps,
                          selection=args.selection)
        log("job ...")
        outcome, failure, seconds = qs.run_product(spec, cache, log)
        if outcome is None:
            raise SystemExit(f"the job published nothing: {failure.get('error')}")
        job = outcome["metrics"]
        result["job"] = {"seconds": round(seconds, 1), "stage_seconds": outcome["stage_seconds"],
                         "devices": {k: job["devices"][k] for k in ("evaluate", "publish")},
                         "new_tokens": len(outcome["extension"]["new_tokens"]),
                         "before": figures(job["before"]), "after": figures(job["after"])}
        log(f"job done in {seconds:.0f}s; evaluated in {job['devices']['evaluate']['dtype']}, "
            f"published in {job['devices']['publish']['dtype']}")
        new_ids = [t["id"] for t in outcome["extension"]["new_tokens"]]
        base_path = resolve_model("smollm2-135m", ModelSources(cache_dir=cache)).path
        result["scored"] = {}
        for name, dtype in PRECISIONS.items():
            log(f"base and published folder in {name} ...")
            result["scored"][name] = {
                "base": figures(score_folder(base_path, dtype, splits["test"], args.eval_bytes, None)),
                "published": figures(score_folder(spec.out_dir, dtype, splits["test"], args.eval_bytes, new_ids)),
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = round(time.time() - started)
    save(out, result)
    log(f"wrote {out}")


def save(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    out.write_text(report(result))


def _change(after: float, before: float) -> str:
    return f"{after / before - 1:+.2%}"


def report(result: dict) -> str:
    job, scored = result["job"], result["scored"]
    fp32, bf16 = scored["float32"], scored["bfloat16"]
    measured, published = job["devices"]["evaluate"]["dtype"], job["devices"]["publish"]["dtype"]
    lines = [
        f"# The published model, scored as published: {qs.DOMAINS[result['domain']]} (issue 37 item 4)", "",
        f"Command: `{result['command']}` ({result['seconds'] / 60:.0f} min on 2 shared CPU cores).", "",
        f"One corpus job through `extension.pipeline.run` on SmolLM2-135M-Instruct (fp32 checkpoint), {result['steps']} "
        f"steps, selection '{result['selection']}', the product's other defaults on this CPU ({result['cpu_kind']}); {job['new_tokens']} new tokens published. "
        f"The job computed its before/after in {measured}; the folder it published holds {published} weights. "
        f"Both were then loaded again from their folders (the base checkpoint, the published folder) and scored on "
        f"the job's own test split ({result['eval_bytes']:,} bytes) and {result['eval_bytes']:,} bytes of general English, "
        "in fp32 and in bf16. Bits per byte: lower is better.", "",
        "| figure | the job's own (card, summary) | scored in fp32 | scored in bf16 | fp32 - bf16 |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    rows = [("base, domain bits/byte", job["before"], fp32["base"], bf16["base"], "domain_bits_per_byte"),
            ("published, domain bits/byte", job["after"], fp32["published"], bf16["published"], "domain_bits_per_byte"),
            ("base, general bits/byte", job["before"], fp32["base"], bf16["base"], "general_bits_per_byte"),
            ("published, general bits/byte", job["after"], fp32["published"], bf16["published"], "general_bits_per_byte")]
    for label, own, full, half, key in rows:
        lines.append(f"| {label} | {own[key]:.4f} | {full[key]:.4f} | {half[key]:.4f} | {full[key] - half[key]:+.4f} |")
    for key, label in (("domain_bits_per_byte", "domain"), ("general_bits_per_byte", "general English")):
        lines.append(f"| published against base, {label} | {_change(job['after'][key], job['before'][key])} | "
                     f"{_change(fp32['published'][key], fp32['base'][key])} | {_change(bf16['published'][key], bf16['base'][key])} | |")
    gap = fp32["published"]["domain_bits_per_byte"] - job["after"]["domain_bits_per_byte"]
    lines += ["", f"What a user downloads ({published}) scores {fp32['published']['domain_bits_per_byte']:.4f} bits per byte "
              f"on the domain's test text where the card says {job['after']['domain_bits_per_byte']:.4f} ({gap:+.4f}); "
              f"against the base in the same precision the change is {_change(fp32['published']['domain_bits_per_byte'], fp32['base']['domain_bits_per_byte'])} "
              f"in fp32 and {_change(job['after']['domain_bits_per_byte'], job['before']['domain_bits_per_byte'])} as the job measured it.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
