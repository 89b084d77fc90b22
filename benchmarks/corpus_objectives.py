"""Training objectives for corpus jobs, side by side on the same windows (issue 3).

Every variant trains the subword-mean rows of SmolLM2 + the quality benchmark's 1,000 top-saving
words on the same centred windows, then scores the first `--eval-bytes` of the held-out split
(bits per byte, extension.evaluation.metrics) and the general text:

  lm                plain next-token loss (TIDE's default, extension/training/loop.py TokenWindows)
  distill           the base model's next-token distributions as soft targets: the teacher reads
                    each window with every new token expanded to its pieces (extension/training/term_contexts.py,
                    the terms-only objective, applied to corpus windows)
  hidden:W          next-token loss + W x the squared distance between the final hidden states
                    and the base model's at the same text, at and after each new token
                    (Token Distillation's input-side signal)
  out_grad:S        next-token loss, with the OUTPUT path's gradient of a tied row scaled by S
                    (the input path keeps its full gradient; the forward is unchanged)
  base              the base model with its own tokenizer (the reference; `--steps 0 --variants lm`
                    scores the untrained subword-mean rows)

    .venv/bin/python benchmarks/corpus_objectives.py --domain es --steps 50 --variants lm,distill,hidden:0.1
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
from extension.training.term_contexts import TermContextObjective, expand  # noqa: E402
from extension.evaluation import evaluate_model, load_general_text  # noqa: E402
from extension.rows.init import subword_mean_rows  # noqa: E402
from extension.rows.adapter import RowsAdapter, attach  # noqa: E402
from extension.tokenizer import extend_tokenizer  # noqa: E402
from extension.training.loop import DEFAULT_SAMPLING, TokenWindows, TrainConfig, train_rows  # noqa: E402


class WindowDistillation(TermContextObjective):
    """distill.py's soft-target loss, fed corpus windows instead of generated contexts."""

    def __init__(self, windows: TokenWindows, extended):
        self.windows = windows
        self.base_vocab_size = extended.base_vocab_size
        self.num_new = len(extended.new_tokens)
        self.pieces = {t.id: t.base_ids for t in extended.new_tokens}
        tokenizer = extended.tokenizer
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        self.objective = "distill"

    def batch(self, step: int):
        return [expand(row.tolist(), self.base_vocab_size, self.pieces) for row in self.windows.batch(step)]


class HiddenStateDistance:
    """Next-token loss + weight x mean squared distance to the base model's final hidden states."""

    def __init__(self, windows: TokenWindows, extended, weight: float):
        self.windows, self.weight = windows, weight
        self.base_vocab_size = extended.base_vocab_size
        self.pieces = {t.id: t.base_ids for t in extended.new_tokens}

    def loss(self, adapter: RowsAdapter, step: int):
        window = self.windows.batch(step)
        inputs, targets = window[:, :-1], window[:, 1:]
        contexts = [expand(row.tolist(), self.base_vocab_size, self.pieces) for row in inputs]
        teacher = torch.zeros(len(contexts), max(len(c.teacher) for c in contexts), dtype=torch.long)
        for b, context in enumerate(contexts):
            teacher[b, : len(context.teacher)] = torch.tensor(context.teacher)
        with torch.no_grad():
            teacher_hidden = adapter.hidden(teacher)  # base ids only: exactly the base model
        last_piece = torch.tensor([c.last_piece for c in contexts])
        aligned = teacher_hidden.gather(1, last_piece[..., None].expand(-1, -1, teacher_hidden.shape[-1]))
        hidden = adapter.hidden(inputs)
        total, count = adapter.loss_sum(hidden, targets)
        after_new = (inputs >= self.base_vocab_size).cumsum(1) > 0
        distance = ((hidden - aligned) ** 2).mean(-1)[after_new]
        if distance.numel():
            total = total + self.weight * count * distance.mean()
        return total, count


def scale_tied_output_gradient(scale: float) -> None:
    """Make a tied adapter's output path pass `scale` x its gradient to the shared row."""
    def logit_rows(self):
        if not self.tied:
            return self.output_rows
        rows = self.input_rows
        return rows * scale + rows.detach() * (1 - scale) if torch.is_grad_enabled() else rows

    RowsAdapter.logit_rows = property(logit_rows)


def run(domain: str, variant: str, steps: int, lr: float, eval_bytes: int) -> dict:
    torch.manual_seed(0)
    model, tokenizer = quality.load_base()
    train_docs, test_docs = quality.domain_split(domain)
    if variant == "base":
        metrics = evaluate_model(model, tokenizer, test_docs, load_general_text(), max_bytes=eval_bytes,
                                 general_max_bytes=eval_bytes // 2)
        return {"domain": domain, "variant": variant, "steps": 0, "lr": lr, "train_seconds": 0,
                "domain_bpb": metrics["domain"]["bits_per_byte"], "general_bpb": metrics["general"]["bits_per_byte"]}
    extended = extend_tokenizer(tokenizer, quality.top_saving_words(tokenizer, train_docs, 1000))
    config = TrainConfig(steps=steps, lr=lr)
    windows = quality.windows(extended.tokenizer, train_docs, extended.base_vocab_size, config, DEFAULT_SAMPLING)
    name, _, value = variant.partition(":")
    objective = {"lm": lambda: windows, "distill": lambda: WindowDistillation(windows, extended),
                 "hidden": lambda: HiddenStateDistance(windows, extended, float(value or 1)),
                 "out_grad": lambda: windows}[name]()
    if name == "out_grad":
        scale_tied_output_gradient(float(value))
    adapter = attach(model, extended.base_vocab_size, subword_mean_rows(model, extended.new_tokens, extended.base_vocab_size))
    started = time.perf_counter()
    train_rows(model, adapter, objective, config)
    seconds = time.perf_counter() - started
    adapter.merge()
    metrics = evaluate_model(model, extended.tokenizer, test_docs, load_general_text(),
                             new_token_ids=[t.id for t in extended.new_tokens], max_bytes=eval_bytes,
                             general_max_bytes=eval_bytes // 2)
    return {"domain": domain, "variant": variant, "steps": steps, "lr": lr, "train_seconds": round(seconds),
            "domain_bpb": metrics["domain"]["bits_per_byte"], "general_bpb": metrics["general"]["bits_per_byte"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domain", choices=quality.DOMAINS, default="es")
    parser.add_argument("--variants", default="lm,distill,hidden:0.1,hidden:1,out_grad:0.1")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=TrainConfig().lr)
    parser.add_argument("--eval-bytes", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:  # one variant per process: out_grad patches the adapter class
        print(json.dumps(run(args.domain, args.child, args.steps, args.lr, args.eval_bytes)))
        return
    import subprocess

    for variant in args.variants.split(","):
        done = subprocess.run([sys.executable, __file__, "--domain", args.domain, "--steps", str(args.steps),
                               "--lr", str(args.lr), "--eval-bytes", str(args.eval_bytes),
                               "--threads", str(args.threads), "--child", variant],
                              capture_output=True, text=True, check=True)
        print(done.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
