"""Where an extended model loses (or wins) bits against the base model, token by token.

The quality benchmark (benchmarks/quality.py) gives one number per system; this script splits
it. Each held-out document is scored twice: by the base model with the base tokenizer and by the
extended model with the extended tokenizer. Every extended token covers a whole run of base
tokens (TIDE's merges only join base tokens), so its loss compares with the base's summed loss
over the same characters. Positions are grouped by what is predicted:

  new target             the next token is a new one (the output rows at work)
  old, right after new   an old token read right after a new one (the input rows at work)
  old, new 2-8 back      an old token with a new one a little earlier in the context
  old, no new in 8       an old token far from any new one

and for old targets the mean probability the model puts on ALL new tokens together (mass the
new rows take from the right answer).

    .venv/bin/python benchmarks/loss_decomposition.py --domain es --steps 0,50 --lr 1e-4,1e-3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

import quality  # noqa: E402
from extension.evaluation import context_token_id  # noqa: E402
from extension.rows.init import subword_mean_rows  # noqa: E402
from extension.rows.adapter import attach  # noqa: E402
from extension.tokenizer import extend_tokenizer  # noqa: E402
from extension.training.loop import DEFAULT_SAMPLING, TrainConfig, train_rows  # noqa: E402

CATEGORIES = ("new target", "old, right after new", "old, new 2-8 back", "old, no new in 8")
MAX_TOKENS = 1024


@torch.no_grad()
def token_losses(model, tokenizer, text: str, context_id: int):
    """(ids, character end of each token, per-token NLL in nats, new-token probability mass)."""
    encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids = ([context_id] + encoded["input_ids"])[:MAX_TOKENS]
    log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
    targets = torch.tensor(ids[1:])
    nll = -log_probs.gather(1, targets[:, None])[:, 0]
    ends = [end for _, end in encoded["offset_mapping"][: len(targets)]]
    return ids[1:], ends, nll.tolist(), log_probs


def category(is_new_target: bool, since_new: int) -> str:
    if is_new_target:
        return CATEGORIES[0]
    if since_new == 1:
        return CATEGORIES[1]
    return CATEGORIES[2] if since_new <= 8 else CATEGORIES[3]


def decompose(model, extended, documents: list[str], base_scores: list) -> dict:
    tokenizer, first_new = extended.tokenizer, extended.base_vocab_size
    context_id = context_token_id(tokenizer)
    table = {name: {"positions": 0, "base_nats": 0.0, "nats": 0.0, "new_mass": 0.0} for name in CATEGORIES}
    for text, (_, base_ends, base_nll, _) in zip(documents, base_scores):
        ids, ends, nll, log_probs = token_losses(model, tokenizer, text, context_id)
        new_mass = log_probs[:, first_new:].exp().sum(-1)
        cursor, last_new = 0, -100
        for k, (token, end, loss) in enumerate(zip(ids, ends, nll)):
            # Both are cut at MAX_TOKENS, and the shorter extended tokens reach further into the
            # text: past the base's last token its losses have nothing to compare with.
            if end > base_ends[-1]:
                break
            base = 0.0
            while cursor < len(base_ends) and base_ends[cursor] <= end:
                base += base_nll[cursor]
                cursor += 1
            if k and ids[k - 1] >= first_new:
                last_new = k - 1
            cell = table[category(token >= first_new, k - last_new)]
            cell["positions"] += 1
            cell["base_nats"] += base
            cell["nats"] += loss
            cell["new_mass"] += float(new_mass[k]) if token < first_new else 0.0
    return table


def load_model(name: str):
    """A built-in base model in fp32 and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from extension.plan.models import ModelSources, resolve_model

    path = resolve_model(name, ModelSources(cache_dir=REPO / ".cache")).path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.requires_grad_(False)
    return model, AutoTokenizer.from_pretrained(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domain", choices=quality.DOMAINS, default="es")
    parser.add_argument("--terms", type=int, default=1000)
    parser.add_argument("--model", choices=("smollm2-135m", "gemma3-270m"), default="smollm2-135m",
                        help="the built-in base model (fp32)")
    parser.add_argument("--lr-multiplier", type=float, help="the rows' learning-rate multiplier (default: the product's)")
    parser.add_argument("--steps", default="0,50", help="comma-separated training budgets (0 = the init)")
    parser.add_argument("--lr", default=str(TrainConfig().lr), help="comma-separated base learning rates")
    parser.add_argument("--eval-bytes", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", type=Path, default=quality.RESULTS / "loss_decomposition.md")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_model(args.model)
    train_docs, test_docs = quality.domain_split(args.domain)
    documents, size = [], 0
    for doc in test_docs:
        if size >= args.eval_bytes:
            break
        documents.append(doc)
        size += len(doc.encode("utf-8"))
    extended = extend_tokenizer(tokenizer, quality.top_saving_words(tokenizer, train_docs, args.terms))
    base_scores = [token_losses(model, tokenizer, doc, context_token_id(tokenizer)) for doc in documents]

    runs = []
    for lr in [float(x) for x in args.lr.split(",")]:
        for steps in [int(x) for x in args.steps.split(",")]:
            if steps == 0 and any(r["steps"] == 0 for r in runs):
                continue
            torch.manual_seed(0)
            config = TrainConfig(steps=steps, lr=lr, **({"embedding_lr_multiplier": args.lr_multiplier}
                                                        if args.lr_multiplier else {}))
            adapter = attach(model, extended.base_vocab_size,
                             subword_mean_rows(model, extended.new_tokens, extended.base_vocab_size))
            started = time.perf_counter()
            if steps:
                windows = quality.windows(extended.tokenizer, train_docs, extended.base_vocab_size, config, DEFAULT_SAMPLING)
                train_rows(model, adapter, windows, config)
            seconds = time.perf_counter() - started
            table = decompose(model, extended, documents, base_scores)
            adapter.detach()
            runs.append({"steps": steps, "lr": lr, "seconds": round(seconds), "table": table})
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    args.out.write_text(report(args, size, runs))
    args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


def report(args, size: int, runs: list[dict]) -> str:
    lines = [
        "# Where the extended model loses bits: a decomposition by position",
        "",
        f"Command: `.venv/bin/python benchmarks/loss_decomposition.py --domain {args.domain} --steps {args.steps} "
        f"--lr {args.lr} --eval-bytes {args.eval_bytes}"
        + ("" if args.model == "smollm2-135m" else f" --model {args.model}")
        + ("" if args.terms == 1000 else f" --terms {args.terms}")
        + ("" if not args.lr_multiplier else f" --lr-multiplier {args.lr_multiplier:g}") + "`",
        "",
        f"{'SmolLM2-135M' if args.model == 'smollm2-135m' else 'Gemma 3 270M'}, {args.terms} terms (quality.py's top-saving words of the {args.domain} train split), "
        f"{size:,} held-out bytes, each document scored from its start (up to {MAX_TOKENS} tokens). "
        "Nats: summed loss of the extended model at those positions vs the base model's summed loss over "
        "the same characters. New mass: mean probability on all new tokens together where the truth is old.",
        "",
        "| run | positions | base nats | extended nats | delta | new mass |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        name = "init (subword mean)" if run["steps"] == 0 else f"{run['steps']} steps, lr {run['lr']:g}"
        total = {"positions": 0, "base_nats": 0.0, "nats": 0.0}
        for cat, cell in run["table"].items():
            mass = f"{cell['new_mass'] / cell['positions']:.3f}" if cat != CATEGORIES[0] and cell["positions"] else "—"
            lines.append(f"| {name}: {cat} | {cell['positions']} | {cell['base_nats']:.0f} | {cell['nats']:.0f} | "
                         f"{cell['nats'] - cell['base_nats']:+.0f} | {mass} |")
            for key in total:
                total[key] += cell[key]
        lines.append(f"| **{name}: all** | {total['positions']} | {total['base_nats']:.0f} | {total['nats']:.0f} | "
                     f"**{total['nats'] - total['base_nats']:+.0f}** | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
