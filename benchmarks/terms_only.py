"""A list of terms alone, no corpus: is the published model as good as its base on the domain's text? (issue 39)

Two lists per domain, neither given any of the domain's text beside it:
  glossary  the whole words a person would list: words (runs of letters; in Chinese, runs of 2 to 4
            Han characters) seen at least 5 times in the train split that the base tokenizer splits
            into at least 3 pieces, the top 100 by count x pieces (`glossary()`)
  pieces    the domain's mined tokens as a list (benchmarks/quality_selection.py's terms_only list)
Each system is a terms-only job through `extension.pipeline.run` on the built-in SmolLM2 (the CPU
default unless `--gpu-default`), its published folder then scored on the domain's test split and
on general English, beside the base model in the same run:
  base                 the base model
  subword_mean         every term at the mean of its pieces' rows, no training (what
                       `resize_token_embeddings(mean_resizing=True)` aims at, without its sampling)
  token_distillation   Token Distillation's recipe as far as the product runs it: the term alone as
                       the prompt, 50-token snippets, input rows distilled on them (init 'distill')
                       with `--td-contexts` per term (the paper: 100), every term kept
  previous             the earlier terms-only default: English templates, every term kept
  new                  today's defaults
  job:K=V[+K=V...]     the product with options set (e.g. job:term_prompts=term)
Where each published model still loses against the base (`--decompose-bytes` of the test split,
benchmarks/loss_decomposition.py's split): at new targets (the output side of the rows), at the
old token read right after a new one (the input side), and further on.
"Saving kept" = (base - published tokens/byte) / (base - the whole list's tokens/byte). The job's
verdict is its own held-out comparison; it agrees when it and the test split both say better, or both worse.
The targets section checks today's default (`new`) against issue 39's targets: the domain's test
split within +1.0% of the base at the CPU default (+0.5% at the GPU default), at least 90% of the
saving kept, general English within +0.3%, the job's verdict agreeing; a missed one says by how much.
`--report PATH.json` writes a results file's report again from its JSON (no job is run).
Smoke: python benchmarks/terms_only.py --domain es --lists glossary --systems base,new --glossary-size 10 --eval-bytes 3000 --max-docs 800
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import regex  # noqa: E402
import torch  # noqa: E402

import loss_decomposition as ld  # noqa: E402
import quality_selection as qs  # noqa: E402
from extension.plan.options import BY_NAME, device_decisions  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
PRESETS = {
    "subword_mean": {"steps": 0, "init": "subword_mean", "selection": "none"},
    "token_distillation": {"term_prompts": "term", "term_context_tokens": 50, "init": "distill", "steps": 1, "selection": "none"},
    "previous": {"term_prompts": "templates", "selection": "none"},
    "new": {},
}
_WORD = regex.compile(r"\p{L}[\p{L}\p{M}'’-]*\p{L}|\p{L}")
_HAN_RUN = regex.compile(r"\p{Han}+")


def glossary(train_docs: list[str], tokenizer, *, size: int = 100, min_count: int = 5, min_pieces: int = 3) -> list[str]:
    """The rule of the module docstring: frequent whole words the base splits into many pieces."""
    counts: Counter = Counter()
    for doc in train_docs:
        counts.update(w for w in _WORD.findall(doc) if not _HAN_RUN.fullmatch(w))
        for run in _HAN_RUN.findall(doc):  # no spaces between Chinese words: every 2-4 character run
            counts.update(run[i:i + n] for n in (2, 3, 4) for i in range(len(run) - n + 1))
    scored = []
    for word, count in counts.items():
        if count >= min_count:
            pieces = len(tokenizer(" " + word if not _HAN_RUN.match(word) else word, add_special_tokens=False)["input_ids"])
            if pieces >= min_pieces:
                scored.append((count * pieces, word))
    return [word for _, word in sorted(scored, key=lambda pair: (-pair[0], pair[1]))[:size]]


def system_changes(name: str, td_contexts: int) -> dict:
    if name in PRESETS:
        changes = dict(PRESETS[name])
        if name == "token_distillation":
            changes.update(term_contexts=td_contexts, distill_contexts=td_contexts)
        return changes
    if name.startswith("job:"):
        return qs.option_setting("ours:" + name.split(":", 1)[1])
    raise SystemExit(f"unknown system {name!r}: {', '.join(PRESETS)}, base, or job:K=V[+K=V...]")


def run_system(spec, name: str, terms: list[str], test_docs: list[str], eval_bytes: int, cache: Path, log,
               decompose_docs: tuple[list[str], list] | None = None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from extension.evaluation import evaluate_model, load_general_text

    outcome, failure, seconds = qs.run_product(replace(spec, terms=terms), cache, log)
    if outcome is None:
        return {"system": name, "published": False, "seconds": round(seconds, 1), **failure}
    model = AutoModelForCausalLM.from_pretrained(spec.out_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(spec.out_dir)
    new_ids = [t["id"] for t in outcome["extension"]["new_tokens"]]
    metrics = evaluate_model(model, tokenizer, test_docs, load_general_text(), new_token_ids=new_ids, max_bytes=eval_bytes)
    selection = outcome["metrics"].get("selection") or {}
    sides = None
    if decompose_docs is not None:
        from types import SimpleNamespace

        base_vocab = outcome["extension"]["vocab"]["base_vocab_size"]
        table = ld.decompose(model, SimpleNamespace(tokenizer=tokenizer, base_vocab_size=base_vocab), *decompose_docs)
        sides = {k: {"positions": v["positions"], "bits": (v["nats"] - v["base_nats"]) / 0.6931471805599453} for k, v in table.items()}
    return {"system": name, "sides": sides, "published": True, "metrics": metrics, "new_tokens": len(new_ids),
            "steps": outcome["metrics"].get("training", {}).get("steps"),
            "terms_kept": len(outcome["extension"].get("terms", [])), "removed": len(selection.get("removed", [])),
            "seconds": round(seconds, 1), "stage_seconds": outcome["stage_seconds"], "contexts": selection.get("contexts"),
            "held_out": outcome["metrics"].get("comparison", {}).get("held_out_contexts_bits_per_byte")}


def offered(terms: list[str], test_docs: list[str], eval_bytes: int, cache: Path) -> float:
    """Tokens per byte of the scored test text with every term of the list added."""
    from transformers import AutoTokenizer

    from extension.evaluation import DEFAULT_CHUNK_BYTES, chunk_documents, document_cap
    from extension.plan.models import ModelSources, resolve_model
    from extension.tokenizer import extend_tokenizer

    base = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m", ModelSources(cache_dir=cache)).path)
    extended = extend_tokenizer(base, terms).tokenizer
    cap = document_cap([len(d.encode("utf-8")) for d in test_docs], eval_bytes)
    chunks = [c for doc in chunk_documents(test_docs, DEFAULT_CHUNK_BYTES, eval_bytes, cap) for c in doc]
    return sum(len(ids) for ids in extended(chunks, add_special_tokens=False)["input_ids"]) / sum(len(c.encode()) for c in chunks)


def main() -> None:
    from transformers import AutoTokenizer

    from extension.plan.models import ModelSources, resolve_model
    from extension.plan.spec import ExtendSpec

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domain", choices=list(qs.DOMAINS))
    parser.add_argument("--lists", default="glossary,pieces")
    parser.add_argument("--systems", default="base,subword_mean,token_distillation,previous,new")
    parser.add_argument("--eval-bytes", type=int, default=20_000, help="test-split bytes scored, and general-English bytes")
    parser.add_argument("--glossary-size", type=int, default=100)
    parser.add_argument("--td-contexts", type=int, default=100, help="token_distillation's contexts per term (the paper's 100)")
    parser.add_argument("--gpu-default", action="store_true", help="the options a GPU worker defaults to (run here on the CPU)")
    parser.add_argument("--decompose-bytes", type=int, default=8_000, help="test-split bytes split by where the loss is (0: none)")
    parser.add_argument("--max-docs", type=int, default=0, help="smoke runs only: the first N documents")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: two runs can share two cores)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path, help="a results JSON of this script: write its .md again, run nothing")
    args = parser.parse_args()
    if args.report:
        result = json.loads(args.report.read_text())
        args.report.with_suffix(".md").write_text(report(result))
        return
    if not args.domain:
        parser.error("--domain is required (or --report PATH.json)")
    torch.set_num_threads(args.threads)
    cache = REPO / ".cache"
    started = time.time()
    out = args.out or RESULTS / f"terms_only_{args.domain}{'_gpu_default' if args.gpu_default else ''}.md"

    def log(message: str) -> None:
        print(f"[{time.time() - started:6.0f}s] {args.domain}: {message}", file=sys.stderr, flush=True)

    docs = qs.documents(args.domain)[: args.max_docs or None]
    splits, data = qs.split_sizes(docs)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m", ModelSources(cache_dir=cache)).path)
    gpu = {o.name: o.default_on("cuda") for o in BY_NAME.values() if o.device_defaults} if args.gpu_default else {}
    result = {"command": "python benchmarks/terms_only.py " + " ".join(sys.argv[1:]), "domain": args.domain, "data": data,
              "eval_bytes": args.eval_bytes, "gpu_default": gpu, "td_contexts": args.td_contexts, "lists": {}, "rows": []}
    decompose_docs = None
    if args.decompose_bytes:
        from extension.evaluation import context_token_id

        chosen, size = [], 0
        for doc in splits["test"]:
            if size >= args.decompose_bytes:
                break
            chosen.append(doc[:4000])
            size += len(chosen[-1].encode())
        base_model, base_tokenizer = qs.quality.load_base()
        decompose_docs = (chosen, [ld.token_losses(base_model, base_tokenizer, d, context_token_id(base_tokenizer)) for d in chosen])
        del base_model
    work = Path(tempfile.mkdtemp(prefix=f"tide_terms_only_{args.domain}_"))
    try:
        corpus = work / "corpus.jsonl"  # only to mine the pieces list; no job is given it
        corpus.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
        lists = {"glossary": lambda: glossary(splits["train"], tokenizer, size=args.glossary_size),
                 "pieces": lambda: qs.mined_term_list(ExtendSpec(base_model="smollm2-135m", out_dir=work, corpus_path=corpus), cache)}
        if "base" in args.systems.split(","):  # first: a run stopped early still has its rows' percentages
            log("base ...")
            result["base"] = qs.evaluate_base(splits["test"], args.eval_bytes, "smollm2-135m", cache)
        for list_name in args.lists.split(","):
            terms = lists[list_name]()
            result["lists"][list_name] = {"terms": terms, "offered_tokens_per_byte": offered(terms, splits["test"], args.eval_bytes, cache)}
            log(f"{list_name}: {len(terms)} terms")
            for name in args.systems.split(","):
                if name == "base":
                    continue
                spec = ExtendSpec(base_model="smollm2-135m", out_dir=work / f"{list_name}_{name.replace(':', '_')}",
                                  allow_local_paths=True, eval_max_bytes=args.eval_bytes, terms=terms)
                spec = replace(spec, **system_changes(name, args.td_contexts))
                if args.gpu_default:  # what a GPU worker decides (plan.job.plan_inputs), run on this CPU
                    spec = replace(spec, **device_decisions(spec, "cuda"))
                log(f"{list_name} / {name} ...")
                row = run_system(spec, name, terms, splits["test"], args.eval_bytes, cache, log, decompose_docs)
                result["rows"].append({"list": list_name, **row})
                log(f"{list_name} / {name} done in {row['seconds']:.0f}s")
                save(out, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = round(time.time() - started)
    save(out, result)
    log(f"wrote {out}")


def save(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    out.write_text(report(result))


def report(result: dict) -> str:
    base = result.get("base")
    lines = [f"# Terms only, no corpus: {qs.DOMAINS[result['domain']]} (issue 39)", "",
             f"Command: `{result['command']}`" + (f" ({result['seconds'] / 60:.0f} min on 2 shared CPU cores)." if "seconds" in result else " (unfinished)."),
             "",
             "Options: " + (f"a GPU worker's defaults ({', '.join(f'{k} {v}' for k, v in result['gpu_default'].items())}), run on "
                            "this CPU: no GPU was lent" if result["gpu_default"] else "this CPU's defaults (bf16 where the CPU computes it)")
             + f"; scored: {result['eval_bytes']:,} bytes of the test split and of general English. Bits per byte: lower is "
             "better; percentages against the base in the same run. Lists: " + "; ".join(
                 f"{name} {len(v['terms'])} terms ({', '.join(v['terms'][:6])}, ...)" for name, v in result["lists"].items()), "",
             "| list | system | domain bits/byte | general bits/byte | tokens/byte | saving kept | terms kept | steps trained | job's verdict | agrees | wall time |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    if base:
        lines.append(f"| — | base | {base['domain']['bits_per_byte']:.4f} | {base['general']['bits_per_byte']:.4f} | "
                     f"{base['domain']['tokens_per_byte']:.4f} | — | — | — | — | — | — |")
    for row in result["rows"]:
        if not row["published"]:
            lines.append(f"| {row['list']} | {row['system']} | nothing published: {row.get('error', '')[:300]} | | | | | | | | {row['seconds']:.0f} s |")
            continue
        m = row["metrics"]
        offered_tpb = result["lists"][row["list"]]["offered_tokens_per_byte"]
        cells = [f"{m['domain']['bits_per_byte']:.4f}", f"{m['general']['bits_per_byte']:.4f}", f"{m['domain']['tokens_per_byte']:.4f}"]
        kept = verdict = agrees = "—"
        if base:
            b = base["domain"]
            cells = [f"{m['domain']['bits_per_byte']:.4f} ({m['domain']['bits_per_byte'] / b['bits_per_byte'] - 1:+.2%})",
                     f"{m['general']['bits_per_byte']:.4f} ({m['general']['bits_per_byte'] / base['general']['bits_per_byte'] - 1:+.2%})",
                     f"{m['domain']['tokens_per_byte']:.4f} ({m['domain']['tokens_per_byte'] / b['tokens_per_byte'] - 1:+.2%})"]
            offered_saving = b["tokens_per_byte"] - offered_tpb
            kept = f"{(b['tokens_per_byte'] - m['domain']['tokens_per_byte']) / offered_saving:.1%}" if offered_saving > 0 else "—"
            held = row.get("held_out")
            if held and held.get("before") is not None:
                job_better = held["after"] <= held["before"]
                verdict = f"{'better' if job_better else 'worse'} ({held['after'] / held['before'] - 1:+.2%})"
                agrees = "yes" if job_better == (m["domain"]["bits_per_byte"] <= b["bits_per_byte"]) else "**no**"
        lines.append(f"| {row['list']} | {row['system']} | {' | '.join(cells)} | {kept} | {row['terms_kept']} | {row.get('steps', '—')} | {verdict} | {agrees} | "
                     f"{row['seconds']:.0f} s |")
    lines += targets(result)
    sided = [row for row in result["rows"] if row.get("sides")]
    if sided:
        names = list(sided[0]["sides"])
        lines += ["", "Where the published model loses or wins against the base, in bits over the decomposed test text "
                  "(positive: worse; benchmarks/loss_decomposition.py's categories):", "",
                  "| list | system | " + " | ".join(names) + " |", "| --- | --- |" + " ---: |" * len(names)]
        for row in sided:
            lines.append(f"| {row['list']} | {row['system']} | " + " | ".join(
                f"{row['sides'][n]['bits']:+.1f} ({row['sides'][n]['positions']})" for n in names) + " |")
    return "\n".join(lines) + "\n"


def _change(value: float, base: float) -> float:
    return value / base - 1


def targets(result: dict) -> list[str]:
    """Issue 39's targets for today's default (`new`), per list: met, or missed by how much."""
    base = result.get("base")
    rows = [row for row in result["rows"] if row["system"] == "new"]
    if not base or not rows:
        return []
    domain_limit = 0.005 if result["gpu_default"] else 0.010
    lines = ["", f"Issue 39's targets for today's default (`new`): domain bits per byte within {domain_limit:+.1%} of the "
             "base, at least 90% of the saving kept, general English within +0.3%, the job's verdict agreeing with the test split:", ""]

    def said(name: str, met: bool, by: str) -> str:
        return f"{name} met" if met else f"{name} **NOT met**, by {by}"

    for row in rows:
        if not row["published"]:
            lines.append(f"- {row['list']}: nothing published, no target met")
            continue
        m, b = row["metrics"], base["domain"]
        domain = _change(m["domain"]["bits_per_byte"], b["bits_per_byte"])
        general = _change(m["general"]["bits_per_byte"], base["general"]["bits_per_byte"])
        saving = b["tokens_per_byte"] - result["lists"][row["list"]]["offered_tokens_per_byte"]
        kept = (b["tokens_per_byte"] - m["domain"]["tokens_per_byte"]) / saving if saving > 0 else 1.0
        held = row.get("held_out") or {}
        parts = [said(f"domain {domain:+.2%}", domain <= domain_limit, f"{(domain - domain_limit) * 100:.2f} points"),
                 said(f"saving kept {kept:.1%}", kept >= 0.9, f"{(0.9 - kept) * 100:.1f} points"),
                 said(f"general {general:+.2%}", general <= 0.003, f"{(general - 0.003) * 100:.2f} points")]
        if held.get("before") is not None:
            agrees = (held["after"] <= held["before"]) == (m["domain"]["bits_per_byte"] <= b["bits_per_byte"])
            parts.append("verdict agrees" if agrees else "verdict **disagrees** with the test split")
        else:
            parts.append("no verdict to check")
        lines.append(f"- {row['list']}: " + "; ".join(parts))
    return lines


if __name__ == "__main__":
    main()
