"""How the new rows start, and the learning rate that trains them (issue 11, item 4).

For each domain: the product's mined tokens (extension.mining at its defaults), the product's
validation split (extension.selection.build_validation: up to 32 KB, scored by the base model),
and for each variant the product's own training (extension.training.loop.train_rows on the centred
corpus windows, default steps, batch and sequence length) from rows made by
extension.rows.init.RowInitializer. Every variant keeps EVERY mined token (no term selection), so the
rows themselves are compared; validation bits per byte is measured at steps 0, half-way and the
end, with where the change against the base model sits, in bits over the validation text:

  new_pred  the new tokens' own predictions, against the base model's on the pieces they replace
  after     the old tokens within 8 positions after a new token (reading the new row)
  other     the old tokens further on
  leak      probability the new tokens take where they are not the answer

Variants are `init@lr` (init: composition or subword_mean; lr: the base learning rate, the rows
get it x the embedding multiplier), all in one process per domain, one after the other:

    nice -n 5 .venv/bin/python benchmarks/init_methods.py --domains es,foldoc --threads 1 \\
        --variants subword_mean@1e-4,composition@1e-4,subword_mean@8e-4,composition@8e-4
    nice -n 5 .venv/bin/python benchmarks/init_methods.py --fits   # the maps alone, on SmolLM2's merges

`--fits` compares, on a held-out tenth of the base vocabulary's own merges, how well each way of
making a row from its two parts predicts the real row (mean cosine): the subword mean, the
product's ridge map (extension.rows.composition.fit_composition) and a two-layer MLP (hidden 1024,
GELU, plus a linear skip) trained on the same nine tenths with AdamW for 30 epochs -- the
question being whether the map needs to be nonlinear.
    .venv/bin/python benchmarks/init_methods.py --domains es --steps 2 --variants composition@1e-4 --out /tmp/i.md  # smoke
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

import quality  # noqa: E402
import quality_selection  # noqa: E402
from extension.plan.options import DEFAULTS  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
FOLLOWING = 8  # as extension.selection.attribution


def decompose(score, base, first_new_id: int) -> dict:
    """Extended minus base, in bits, split by what the position is (see the module docstring)."""
    parts = {"new_pred": 0.0, "after": 0.0, "other": 0.0}
    for ext, ref in zip(score.chunks, base.chunks):
        cumulative = [0.0, *ref.nll.cumsum(0).tolist()]
        own = ext.own_nll if ext.own_nll is not None else ext.nll
        since_new = FOLLOWING + 1
        for i, token in enumerate(ext.ids):
            start = ext.ends[i - 1] if i else -1
            first, last = bisect.bisect_right(ref.ends, start), bisect.bisect_right(ref.ends, ext.ends[i])
            change = float(own[i]) - (cumulative[last] - cumulative[first])
            if token >= first_new_id:
                parts["new_pred"] += change
                since_new = 0
            else:
                since_new += 1
                parts["after" if since_new <= FOLLOWING else "other"] += change
    parts["leak"] = float(score.leak.sum()) if score.leak is not None else 0.0
    return {name: round(value / math.log(2), 1) for name, value in parts.items()}


class Checkpoints:
    """train.StepValidation that scores the whole validation text at the given steps."""

    def __init__(self, validation, extended, steps: set[int], log):
        self.validation, self.extended, self.steps, self.log = validation, extended, steps, log
        self.records: list[dict] = []
        self.step = 0  # train_rows scores step 0 without asking, then asks due(step) before each call

    def due(self, step: int) -> bool:
        self.step = step
        return step in self.steps

    def __call__(self, adapter) -> float:
        score = self.validation.score(adapter.model, self.extended, leak=True)
        base = self.validation.base
        record = {"step": self.step, "bits_per_byte": score.bits_per_byte,
                  "vs_base": score.bits_per_byte / base.bits_per_byte - 1,
                  **decompose(score, base, self.extended.base_vocab_size)}
        self.records.append(record)
        self.log(f"    step {record['step']}: {score.bits_per_byte:.4f} ({100 * record['vs_base']:+.2f}%) {record}")
        return score.bits_per_byte


def run_domain(domain: str, variants: list[tuple[str, float]], steps: int, log) -> dict:
    from extension.plan.corpus import split_documents
    from extension.rows.init import RowInitializer
    from extension.mining import mine_terms
    from extension.rows.adapter import attach
    from extension.selection import build_validation
    from extension.training.loop import TrainConfig, corpus_windows, train_rows

    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / f"{domain}.jsonl"
        corpus.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in quality_selection.documents(domain)),
                          encoding="utf-8")
        model, tokenizer = quality.load_base()
        mined = mine_terms(tokenizer, corpus, max_new_tokens=DEFAULTS["max_new_tokens"], min_frequency=DEFAULTS["min_frequency"])
        extended = mined.extended
        validation = build_validation(model, tokenizer, list(split_documents(corpus, "validation")), source="corpus validation split")
        log(f"{domain}: {len(extended.new_tokens)} new tokens, validation {validation.bytes:,} bytes, "
            f"base {validation.base.bits_per_byte:.4f} bits/byte")
        rows_out = []
        for init, lr in variants:
            torch.manual_seed(0)
            config = TrainConfig(steps=steps, lr=lr)
            started = time.perf_counter()
            initializer = RowInitializer(model, tokenizer, init)
            rows = initializer(model, extended)
            init_seconds = time.perf_counter() - started
            windows = corpus_windows(corpus, extended.tokenizer, base_vocab_size=extended.base_vocab_size, config=config)
            checkpoints = Checkpoints(validation, extended, {0, steps // 2, steps}, log)
            log(f"  {init} @ lr {lr:g}")
            adapter = attach(model, extended.base_vocab_size, rows)
            try:
                trained = train_rows(model, adapter, windows, config, validate=checkpoints)
            finally:
                adapter.detach()
            rows_out.append({"init": init, "lr": lr, "init_report": initializer.report(), "init_seconds": round(init_seconds, 2),
                             "training_seconds": trained.seconds["training"], "checkpoints": checkpoints.records})
        return {"domain": domain, "new_tokens": len(extended.new_tokens), "validation_bytes": validation.bytes,
                "base_bits_per_byte": validation.base.bits_per_byte,
                "tokens_per_byte": {"base": validation.base.tokens / validation.bytes}, "variants": rows_out}


def render(result: dict) -> str:
    lines = [
        "# How the new rows start, and the learning rate that trains them (issue 11, item 4)",
        "",
        f"Command: `{result['command']}` ({result['seconds'] // 60} min on 2 CPU cores).",
        "",
        f"SmolLM2-135M-Instruct, fp32, CPU. Per domain: the product's mined tokens (up to {DEFAULTS['max_new_tokens']}), "
        f"EVERY one kept (no term selection: the rows are what is compared), trained by the product's loop "
        f"(extension.training.loop.train_rows) on its centred corpus windows for {result['steps']} steps x batch "
        f"{DEFAULTS['batch_size']} x seq {DEFAULTS['seq_len']}, rows' lr = base lr x {DEFAULTS['embedding_lr_multiplier']:g}. "
        "Scored: the product's validation split (up to 32 KB; extension.selection.build_validation). Bits per byte, lower "
        "is better; the percentage is against the base model on the same text. The last four columns split the change "
        "against the base (at the last step) in bits over the validation text: the new tokens' own predictions, the "
        "old tokens read within 8 positions after a new token, old tokens further on, and the new tokens' leak "
        "(probability taken where they are not the answer).",
        "",
        "| domain | init | base lr | step 0 | step " + str(result["steps"] // 2) + " | step " + str(result["steps"])
        + " | new_pred | after | other | leak | init s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for domain in result["domains"]:
        for variant in domain["variants"]:
            marks = variant["checkpoints"]
            cells = [f"{m['bits_per_byte']:.4f} ({100 * m['vs_base']:+.2f}%)" for m in marks]
            last = marks[-1]
            lines.append(f"| {domain['domain']} (base {domain['base_bits_per_byte']:.4f}) | {variant['init_report']['method']} | "
                         f"{variant['lr']:g} | " + " | ".join(cells)
                         + f" | {last['new_pred']} | {last['after']} | {last['other']} | {last['leak']} | {variant['init_seconds']} |")
    lines += ["", "Composition fits (held-out cosine of the fitted map vs the subword mean, on the base merges):", ""]
    seen = set()
    for domain in result["domains"]:
        for variant in domain["variants"]:
            fit = variant["init_report"].get("input")
            if fit and json.dumps(fit) not in seen:
                seen.add(json.dumps(fit))
                lines.append(f"- {fit}")
    return "\n".join(lines) + "\n"


def compare_fits(epochs: int = 30, hidden: int = 1024) -> dict:
    from extension.rows.composition import base_merge_ids, fit_composition

    model, tokenizer = quality.load_base()
    rows = model.get_input_embeddings().weight.detach().float()
    merges = torch.tensor(base_merge_ids(tokenizer))
    held_out = torch.arange(len(merges)) % 10 == 9  # the split fit_composition uses
    fit, _ = fit_composition(rows, merges.tolist())
    left, right, target = rows[merges[:, 0]], rows[merges[:, 1]], rows[merges[:, 2]]
    features = torch.cat([left, right], 1)
    torch.manual_seed(0)
    linear = torch.nn.Linear(features.shape[1], rows.shape[1])
    mlp = torch.nn.Sequential(torch.nn.Linear(features.shape[1], hidden), torch.nn.GELU(), torch.nn.Linear(hidden, rows.shape[1]))
    optimizer = torch.optim.AdamW([*linear.parameters(), *mlp.parameters()], lr=1e-3, weight_decay=1e-4)
    train = torch.nonzero(~held_out).flatten()
    started = time.perf_counter()
    for _epoch in range(epochs):
        for batch in train[torch.randperm(len(train))].split(512):
            loss = ((linear(features[batch]) + mlp(features[batch]) - target[batch]) ** 2).sum(1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        predicted = linear(features[held_out]) + mlp(features[held_out])
    cos = torch.nn.functional.cosine_similarity
    return {"merges": len(merges), "held_out": int(held_out.sum()),
            "subword_mean": float(cos((left + right)[held_out] / 2, target[held_out], dim=1).mean()),
            "ridge (the product's)": fit.held_out_cosine, "mlp": float(cos(predicted, target[held_out], dim=1).mean()),
            "mlp_seconds": round(time.perf_counter() - started, 1), "epochs": epochs, "hidden": hidden}


def render_fits(fits: dict, command: str) -> str:
    lines = ["# Composing a row from its two parts: which map (SmolLM2's own merges)", "",
             f"Command: `{command}`.", "",
             f"SmolLM2-135M-Instruct's input embedding; {fits['merges']:,} base merges whose parts and result are in the "
             f"vocabulary, every tenth held out ({fits['held_out']:,}); mean cosine between the predicted and the real row "
             "of each held-out merge's result (higher is better).", "",
             "| map | held-out cosine |", "| --- | ---: |"]
    for name in ("subword_mean", "ridge (the product's)", "mlp"):
        lines.append(f"| {name} | {fits[name]:.4f} |")
    lines += ["", f"MLP: hidden {fits['hidden']}, GELU, plus a linear skip, {fits['epochs']} epochs of AdamW ({fits['mlp_seconds']} s)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # The two domains defaults are chosen on; the old default (subword mean @ 1e-4) against the new one,
    # with each change alone.
    parser.add_argument("--domains", default="es,foldoc")
    parser.add_argument("--variants", default="subword_mean@1e-4,composition@1e-4,subword_mean@8e-4,composition@8e-4")
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="default results/init_methods.md (--fits: composition_fits.md)")
    parser.add_argument("--fits", action="store_true", help="only compare the maps on the base merges")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.fits:
        out = args.out or RESULTS / "composition_fits.md"
        out.write_text(render_fits(compare_fits(), "python benchmarks/init_methods.py " + " ".join(sys.argv[1:])))
        print(out.read_text())
        return
    args.out = args.out or RESULTS / "init_methods.md"
    variants = [(v.split("@")[0], float(v.split("@")[1])) for v in args.variants.split(",")]
    started = time.time()
    result = {"command": "python benchmarks/init_methods.py " + " ".join(sys.argv[1:]), "steps": args.steps, "domains": []}
    for domain in args.domains.split(","):
        result["domains"].append(run_domain(domain, variants, args.steps, lambda m: print(m, flush=True)))
        result["seconds"] = round(time.time() - started)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        args.out.write_text(render(result))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
