"""Extending a training run in progress: TIDE against the usual recipes (issue 10).

One `transformers.Trainer` run (full fine-tune of SmolLM2-135M-Instruct, AdamW, Trainer's linear
schedule with warmup) trains on a domain corpus to step K and saves a real checkpoint there. From
that one checkpoint every system continues to step N with the same arguments, seed and data order
(each is a `trainer.train(resume_from_checkpoint=...)`, so each skips the same K batches and
restores the same RNG state); batches are tokenized on the fly by each system's own tokenizer:

  tide                  (a) `tide extend --base-model <checkpoint> --corpus <train split>` (the
                        product's door, run as the CLI in a child process): terms mined, new rows
                        subword-mean initialised and trained by TIDE (its defaults), the published
                        folder a resumable checkpoint with the run's optimizer.pt grown
  hf_fresh_adam         (b) the usual recipe: the checkpoint's model, `resize_token_embeddings(...,
                        mean_resizing=True)`, a fresh AdamW (no moments, step 0). The LR schedule
                        keeps its position (scheduler.pt carried): the gentlest form of the recipe,
                        so only the rows and the optimizer state differ from (a)
  hf_fresh_trainer      (b') the same rows and a fresh AdamW AND a fresh LR schedule (warmup again,
                        then the same linear decay towards step N counted from the restart): what
                        a new Trainer built with the run's arguments does
  subword_mean_kept     (c) (a)'s published folder with every new row set back to the subword mean
                        of the checkpoint's rows (its `new_tokens[].base_ids`) and the new rows'
                        moments zeroed: untrained rows, the old moments kept
  no_extension          (d) control: the checkpoint resumed as it is, base tokenizer

(b), (b') and (c) use exactly (a)'s extended tokenizer (after TIDE's term selection, which can
drop mined terms, so (c) is built from (a)'s folder rather than by a second `tide extend
--steps 0`, whose selection would keep other terms), so only the rows and the optimizer state
differ. Per-token loss is not comparable across tokenizers: each system
is scored in bits per byte on the same held-out domain text (extension.evaluation.metrics.score_documents)
at step K (before and right after the extension) and every few steps up to N. Reported per
system: the value at K before the extension, the worst value from the extension to N and its
excess over the value before, the steps until it is back at or below that value, the value at N,
the steps each system needs to reach (b)'s value at N, and how far the old embedding rows (and
the rest of the model) moved from the checkpoint and from the control (d) by step N.

Targets (issue 10): TIDE's worst value after the extension at most +1% over the value before;
(b)'s bits per byte at N reached by TIDE in at most half the steps after the extension.

Domains (read from Debian packages at run time, never copied into the repository):
  es      Spanish sayings, fortunes-es (/usr/share/games/fortunes/es/*.fortunes, one entry a doc)
  foldoc  English computing dictionary, dict-foldoc (/usr/share/dictd/foldoc.dict.dz)
The product's own hash split (`extension.plan.corpus.split_of`) is used throughout: the Trainer trains on
the train split (documents packed into rows of at most --row-bytes bytes); `tide extend` is given
the whole corpus as JSONL (one document a line, as a user would give it), so it mines and trains
on the same train split, chooses on its validation split, and never sees the test split; every
system is scored on the first --eval-bytes of the test split (shuffled once, so they span the
whole domain).

    nice -n 5 .venv/bin/python benchmarks/continue_training.py                       # ~1 h, 2 cores
    .venv/bin/python benchmarks/continue_training.py --k 4 --n 10 --eval-every 3 \\
        --eval-bytes 2000 --tide-steps 3 --out /tmp/ct.md                           # smoke, ~10 min
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

from extension.plan.options import DEFAULTS  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
SYSTEMS = ("tide", "hf_fresh_adam", "hf_fresh_trainer", "subword_mean_kept", "no_extension")
LABELS = {
    "tide": "(a) TIDE (`tide extend` on the checkpoint, resumed)",
    "hf_fresh_adam": "(b) mean_resizing + fresh AdamW, schedule kept",
    "hf_fresh_trainer": "(b') mean_resizing + fresh AdamW + fresh schedule",
    "subword_mean_kept": "(c) subword mean, old moments kept, new rows untrained",
    "no_extension": "(d) no extension (control)",
}
TARGET_WORST = 1.0  # percent over the value before the extension
# Files a Trainer checkpoint holds besides the model, optimizer.pt and scheduler.pt.
RUN_FILES = ("trainer_state.json", "training_args.bin")


# -- data -------------------------------------------------------------------------------------------
def domain_documents(domain: str) -> list[str]:
    from quality import foldoc_documents, spanish_documents

    return spanish_documents() if domain == "es" else foldoc_documents()


def split(domain: str) -> tuple[list[str], list[str], list[str]]:
    """(every document, the train split, the test split shuffled) by the product's own hash split."""
    from extension.plan.corpus import split_of

    docs = domain_documents(domain)
    train = [d for d in docs if split_of(d) == "train"]
    test = [d for d in docs if split_of(d) == "test"]
    random.Random(0).shuffle(test)  # the first --eval-bytes span the whole domain, not one file
    return docs, train, test


def pack_rows(documents: list[str], row_bytes: int) -> list[dict]:
    """Training rows of at most `row_bytes` UTF-8 bytes: long documents cut (at whitespace, by
    extension.evaluation.metrics's cutter), short ones joined with blank lines, in corpus order."""
    from extension.evaluation import chunk_documents

    rows: list[dict] = []
    current: list[str] = []
    size = 0
    for chunks in chunk_documents(documents, row_bytes, None):
        for chunk in chunks:
            length = len(chunk.encode("utf-8"))
            if current and size + 2 + length > row_bytes:
                rows.append({"text": "\n\n".join(current)})
                current, size = [], 0
            current.append(chunk)
            size += length + (2 if size else 0)
    if current:
        rows.append({"text": "\n\n".join(current)})
    return rows


class Collate:
    """Tokenizes each batch when it is drawn (the way a run's collator picks up new tokens)."""

    def __init__(self, tokenizer, seq_len: int):
        self.tokenizer, self.seq_len = tokenizer, seq_len

    def __call__(self, rows):
        batch = self.tokenizer([r["text"] for r in rows], truncation=True, max_length=self.seq_len,
                               padding="longest", return_tensors="pt")
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return {**batch, "labels": labels}


# -- the Trainer runs -------------------------------------------------------------------------------
def training_args(out_dir: Path, cfg: argparse.Namespace, *, save: bool):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out_dir), max_steps=cfg.n, per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.lr, warmup_steps=cfg.warmup, lr_scheduler_type="linear", seed=cfg.seed,
        logging_steps=1, save_strategy="steps" if save else "no", save_steps=cfg.k,
        report_to=[], use_cpu=True, dataloader_num_workers=0, remove_unused_columns=False,
        disable_tqdm=True,
    )


class Scorer:
    """Held-out domain bits per byte of a model with one tokenizer; times itself."""

    def __init__(self, held_out: list[str], max_bytes: int):
        self.held_out, self.max_bytes, self.seconds = held_out, max_bytes, 0.0

    def __call__(self, model, tokenizer) -> dict:
        from extension.evaluation import score_documents

        started = time.perf_counter()
        result = score_documents(model, tokenizer, self.held_out, max_bytes=self.max_bytes)
        self.seconds += time.perf_counter() - started
        return {"bits_per_byte": result["bits_per_byte"], "tokens_per_byte": result["tokens_per_byte"],
                "bytes": result["bytes"]}


def callbacks(scorer: Scorer, tokenizer, eval_steps: set[int], series: list[dict], stop_at: int | None = None):
    from transformers import TrainerCallback

    class Evaluate(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step in eval_steps:
                series.append({"step": state.global_step, **scorer(model, tokenizer)})
                print(f"  step {state.global_step}: {series[-1]['bits_per_byte']:.4f} bits/byte", flush=True)
            if stop_at is not None and state.global_step >= stop_at:
                control.should_training_stop = True  # after DefaultFlowCallback asked for the save at K
            return control

    return [Evaluate()]


def losses(trainer) -> list[dict]:
    return [{"step": e["step"], "loss": e["loss"]} for e in trainer.state.log_history if "loss" in e]


def load(folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    return model, AutoTokenizer.from_pretrained(folder)


def base_run(cfg, base_path: Path, rows: list[dict], scorer: Scorer, run_dir: Path) -> dict:
    from transformers import Trainer

    model, tokenizer = load(base_path)
    series = [{"step": 0, **scorer(model, tokenizer)}]
    eval_steps = set(range(cfg.eval_every, cfg.k + 1, cfg.eval_every)) | {cfg.k}
    trainer = Trainer(model=model, args=training_args(run_dir, cfg, save=True), train_dataset=rows,
                      data_collator=Collate(tokenizer, cfg.seq_len), processing_class=tokenizer,
                      callbacks=callbacks(scorer, tokenizer, eval_steps, series, stop_at=cfg.k))
    started, scored = time.perf_counter(), scorer.seconds
    trainer.train()
    seconds = time.perf_counter() - started - (scorer.seconds - scored)
    checkpoint = run_dir / f"checkpoint-{cfg.k}"
    if not (checkpoint / "optimizer.pt").is_file():
        raise SystemExit(f"the base run saved no checkpoint at {checkpoint}")
    return {"checkpoint": checkpoint, "series": series, "losses": losses(trainer),
            "train_seconds": round(seconds, 1), "base_vocab_size": len(tokenizer)}


REFUSED = "tide: error (corpus): no new token paid for itself"


def tide_extend(cfg, checkpoint: Path, corpus: Path, out: Path, steps: int, log: Path, extra: tuple = ()) -> dict:
    """`tide extend` on the checkpoint, in a child process (its own memory), as a user runs it.
    {"refused": message} when its validation selection published nothing (a documented outcome,
    not a crash)."""
    command = [sys.executable, "-m", "app.cli", "extend", "--base-model", str(checkpoint), "--corpus", str(corpus),
               "--out", str(out), "--steps", str(steps), "--eval-bytes", str(cfg.tide_eval_bytes),
               "--seed", str(cfg.seed), "--force", *extra]
    threads = str(cfg.threads)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    started = time.perf_counter()
    with log.open("w") as handle:
        done = subprocess.run(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    refusal = next((line for line in log.read_text().splitlines() if line.startswith(REFUSED)), None)
    if done.returncode == 2 and refusal:
        return {"refused": refusal.removeprefix("tide: error (corpus): "), "seconds": round(seconds, 1),
                "command": "tide " + " ".join(command[3:])}
    if done.returncode != 0:
        raise SystemExit(f"tide extend failed ({done.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    extension = json.loads((out / "tide_extension.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").is_file() else {}
    return {"seconds": round(seconds, 1), "extension": extension, "metrics": metrics,
            "command": "tide " + " ".join(command[3:])}


def hf_checkpoint(checkpoint: Path, tide_out: Path, out: Path, *, keep_schedule: bool) -> None:
    """The usual recipe as a resumable folder: the checkpoint's model resized with
    mean_resizing=True to (a)'s vocabulary size, (a)'s tokenizer, a fresh AdamW.

    keep_schedule: optimizer.pt holds the run's parameter groups (their LRs) and no state, so the
    Trainer loads it and scheduler.pt (both or neither) and AdamW starts from zero moments at
    step 0 while the LR schedule goes on where it was. Without it neither file is written: the
    Trainer builds a fresh AdamW and a fresh schedule (warmup again)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    vocab_size = json.loads((tide_out / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)  # mean_resizing samples the new rows
    model.resize_token_embeddings(vocab_size, mean_resizing=True)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tide_out).save_pretrained(out)
    for name in RUN_FILES:
        shutil.copy2(checkpoint / name, out / name)
    for path in checkpoint.glob("rng_state*.pth"):
        shutil.copy2(path, out / path.name)
    if keep_schedule:
        saved = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)
        torch.save({"state": {}, "param_groups": saved["param_groups"]}, out / "optimizer.pt")
        shutil.copy2(checkpoint / "scheduler.pt", out / "scheduler.pt")


def untrained_rows_checkpoint(checkpoint: Path, tide_out: Path, out: Path) -> dict:
    """(c): (a)'s resumable folder with the new rows back at their subword-mean init (the mean of
    the checkpoint's rows of each new token's base pieces, as TIDE initialises them) and the new
    rows' AdamW moments zero. Everything else (tokenizer, old rows, old moments, padding rows,
    scheduler, trainer state) is (a)'s, byte for byte."""
    from types import SimpleNamespace

    from extension.rows.init import is_tied, subword_mean_rows

    started = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(tide_out, out)
    extension = json.loads((out / "tide_extension.json").read_text())
    base_vocab = extension["vocab"]["base_vocab_size"]
    new_tokens = [SimpleNamespace(token=t["token"], base_ids=t["base_ids"]) for t in extension["new_tokens"]]
    source, _ = load(checkpoint)
    rows = subword_mean_rows(source, new_tokens, base_vocab)
    model, _ = load(out)
    new = slice(base_vocab, base_vocab + len(new_tokens))
    with torch.no_grad():
        model.get_input_embeddings().weight[new] = rows.input.to(model.dtype)
        if not is_tied(model):
            model.get_output_embeddings().weight[new] = rows.output.to(model.dtype)
    model.save_pretrained(out)
    state = torch.load(out / "optimizer.pt", map_location="cpu", weights_only=True)
    vocab_size = model.get_input_embeddings().weight.shape[0]
    zeroed = 0
    for entry in state["state"].values():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in entry and entry[key].dim() == 2 and entry[key].shape[0] == vocab_size:
                entry[key][new] = 0
                zeroed += 1
    if not zeroed:
        raise SystemExit("(c): found no vocab-sized moments in (a)'s optimizer.pt to zero")
    torch.save(state, out / "optimizer.pt")
    return {"seconds": round(time.perf_counter() - started, 1), "new_rows": len(new_tokens), "moments_zeroed": zeroed}


def selection_summary(extension: dict) -> dict:
    selection = extension.get("selection") or {}
    if selection.get("mode") == "none":
        return {}
    rounds = selection.get("rounds", [])
    return {"best_step": selection.get("best_step"), "removed_terms": len(selection.get("removed", [])),
            "kept_tokens": selection.get("kept"), "offered_tokens": rounds[0]["new_tokens"] if rounds else None,
            "rounds": len(rounds)} if selection else {}


def vocab_rows(model, base_vocab: int) -> dict[str, torch.Tensor]:
    """The old rows of each vocab-sized parameter (tied: the embedding only), cloned."""
    from extension.training.optimizer_state import vocab_parameters

    roles = vocab_parameters(model)
    return {role: p.detach()[:base_vocab].clone() for p in model.parameters() for key, role in roles.items() if id(p) == key}


def body(model) -> dict[str, torch.Tensor]:
    """Every parameter that is not vocab-sized, cloned."""
    from extension.training.optimizer_state import vocab_parameters

    roles = vocab_parameters(model)
    return {name: p.detach().clone() for name, p in model.named_parameters() if id(p) not in roles}


def relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a)
    den = sum(float(ref[k].double().pow(2).sum()) for k in a)
    return math.sqrt(num / den)


def continue_run(cfg, system: str, folder: Path, rows, scorer: Scorer, run_dir: Path, fresh_optimizer: bool):
    """(the system's results, its model at N)"""
    from transformers import Trainer

    model, tokenizer = load(folder)
    series = [{"step": cfg.k, **scorer(model, tokenizer)}]
    print(f"  step {cfg.k} (after extension): {series[0]['bits_per_byte']:.4f} bits/byte", flush=True)
    trainer = Trainer(model=model, args=training_args(run_dir, cfg, save=False), train_dataset=rows,
                      data_collator=Collate(tokenizer, cfg.seq_len), processing_class=tokenizer,
                      callbacks=callbacks(scorer, tokenizer, eval_points(cfg), series))
    started, scored = time.perf_counter(), scorer.seconds
    trainer.train(resume_from_checkpoint=str(folder))
    seconds = time.perf_counter() - started - (scorer.seconds - scored)
    if trainer.state.global_step != cfg.n:
        raise SystemExit(f"{system}: the run stopped at step {trainer.state.global_step}, not {cfg.n}")
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    steps = sorted({int(s["step"]) for s in optimizer.state.values()})
    expected = [cfg.n - cfg.k] if fresh_optimizer else [cfg.n]
    if steps != expected:  # the optimizer state was (or was not) carried, as the system says
        raise SystemExit(f"{system}: AdamW step counts at N are {steps}, expected {expected}")
    lrs = [e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e and e["step"] > cfg.k]
    result = {"series": series, "losses": losses(trainer), "train_seconds": round(seconds, 1),
              "adam_steps_at_n": steps, "lr_first": lrs[0] if lrs else None, "lr_last": lrs[-1] if lrs else None,
              "vocab_size": model.get_input_embeddings().weight.shape[0], "tokenizer_size": len(tokenizer)}
    return result, trainer.model


def eval_points(cfg) -> set[int]:
    early = {cfg.k + int(s) for s in cfg.eval_early.split(",") if s.strip()}
    regular = set(range(cfg.k + cfg.eval_every, cfg.n + 1, cfg.eval_every))
    return {s for s in early | regular | {cfg.n} if cfg.k < s <= cfg.n}


# -- the summary ------------------------------------------------------------------------------------
def summarise(cfg, before: float, results: dict[str, dict]) -> dict:
    target_b = results["hf_fresh_adam"]["series"][-1]["bits_per_byte"] if "hf_fresh_adam" in results else None
    summary = {}
    for system, result in results.items():
        series = result["series"]  # from step K (after the extension) to N
        worst = max(series, key=lambda p: p["bits_per_byte"])
        back = next((p["step"] - cfg.k for p in series if p["bits_per_byte"] <= before), None)
        reach_b = None
        if target_b is not None:
            reach_b = next((p["step"] - cfg.k for p in series if p["bits_per_byte"] <= target_b), None)
        summary[system] = {
            "at_k_after_extension": series[0]["bits_per_byte"],
            "worst": worst["bits_per_byte"], "worst_step": worst["step"],
            "worst_vs_before_pct": 100 * (worst["bits_per_byte"] / before - 1),
            "steps_back_to_before": back,
            "at_n": series[-1]["bits_per_byte"],
            "at_n_vs_before_pct": 100 * (series[-1]["bits_per_byte"] / before - 1),
            "steps_to_reach_b_at_n": reach_b,
            "tokens_per_byte": series[-1]["tokens_per_byte"],
        }
    return summary


def fmt(value, spec=".4f", none="never") -> str:
    if value is None:
        return none
    return format(value, spec)


def pct(value: float) -> str:
    return f"{value:+.2f}%"


def plot(path: Path, cfg, payload: dict) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    base, results, before = payload["base_run"], payload["systems"], payload["before"]
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
    steps = [p["step"] for p in base["series"]]
    ax.plot(steps, [p["bits_per_byte"] for p in base["series"]], color="0.4", marker=".", label="run before K (shared)")
    styles = {"tide": ("C0", "o"), "hf_fresh_adam": ("C3", "s"), "hf_fresh_trainer": ("C1", "^"),
              "subword_mean_kept": ("C2", "D"), "no_extension": ("0.2", "x")}
    short = {"tide": "(a) TIDE", "hf_fresh_adam": "(b) mean_resizing, fresh AdamW",
             "hf_fresh_trainer": "(b') mean_resizing, fresh AdamW + schedule",
             "subword_mean_kept": "(c) subword mean, moments kept, untrained", "no_extension": "(d) no extension"}
    for system in sorted(results, key=lambda s: s == "tide"):  # TIDE drawn last, on top
        result = results[system]
        color, marker = styles[system]
        ax.plot([p["step"] for p in result["series"]], [p["bits_per_byte"] for p in result["series"]],
                color=color, marker=marker, markersize=3, linewidth=1.2, label=short[system])
    ax.axhline(before, color="0.6", linestyle=":", linewidth=1, label="value at K, before the extension")
    ax.axvline(cfg.k, color="0.6", linestyle="--", linewidth=1)
    values = [p["bits_per_byte"] for r in results.values() for p in r["series"]] + [before]
    low, high = min(values), max(values)
    ax.set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))
    ax.set_xlim(max(0, cfg.k - 3 * cfg.eval_every), cfg.n + 2)
    ax.set_xlabel("Trainer step (vocabulary extended at step K = %d)" % cfg.k)
    ax.set_ylabel("held-out bits per byte")
    ax.set_title(f"Continuing a run after extending its vocabulary ({cfg.domain}, SmolLM2-135M)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def selection_words(tide: dict) -> str:
    """What TIDE's validation selection decided, from its tide_extension.json (runs before selection had none)."""
    selection = tide.get("selection") or {}
    if not selection:
        return ""
    words = f"; its validation selection published the rows of step {selection.get('best_step')}"
    if selection.get("offered_tokens") is not None:
        words += (f" and kept {selection['kept_tokens']} of the {selection['offered_tokens']} new tokens mined "
                  f"({selection['rounds']} rounds)")
    return words


def report(cfg, payload: dict, plotted: bool, rebuilt_by: str | None = None) -> str:
    data, base, tide, before = payload["data"], payload["base_run"], payload["tide"], payload["before"]
    results = payload["systems"]
    summary = summarise(cfg, before, results)
    drift = {system: result["drift"] for system, result in results.items()}
    labels = {system: result.get("label") or LABELS[system] for system, result in results.items()}
    counts, carried = tide.get("counts") or {}, tide.get("trainer_checkpoint") or {}
    machine = payload.get("machine", {})
    lines = [
        "# Extending a training run in progress: TIDE vs the usual recipes",
        "",
        f"Produced by `benchmarks/continue_training.py` on {payload.get('date', '?')} "
        f"({machine.get('arch', 'x86_64')}, {machine.get('cpus', 2)} CPUs shared with other work, "
        f"Python {machine.get('python', platform.python_version())}, torch {machine.get('torch', torch.__version__)}). Command:",
        "",
        "```",
        payload["command"],
        "```",
        "",
    ]
    if rebuilt_by:
        lines += [f"This page and the plot were rebuilt from that run's JSON (nothing re-measured) by `{rebuilt_by}`.", ""]
    lines += [
        f"Domain `{cfg.domain}`: {data['documents']} documents, train split {data['train_bytes']:,} bytes "
        f"packed into {data['rows']} rows of at most {cfg.row_bytes} bytes; test split "
        f"(the product's hash split, `extension.plan.corpus.split_of`) {data['held_out_bytes']:,} bytes, of which the first "
        f"{data['eval_bytes']:,} bytes are scored. Model: SmolLM2-135M-Instruct, full fine-tune with "
        f"`transformers.Trainer` (AdamW, lr {cfg.lr:g}, linear schedule to step N = {cfg.n} with "
        f"{cfg.warmup} warmup steps, batch {cfg.batch_size} x at most {cfg.seq_len} tokens, seed {cfg.seed}); "
        f"checkpoint at K = {cfg.k}, every system resumed from it to N = {cfg.n} with the same data order.",
        "",
        f"TIDE mined {counts.get('terms_added', '?')} terms ({counts.get('new_vocab_entries', '?')} new vocabulary "
        f"entries, vocabulary {tide['vocab']['base_vocab_size']:,} -> {tide['vocab']['vocab_size']:,} with padding) from "
        f"its train split (given the whole corpus as JSONL, it chose on its validation split and never saw the "
        f"test split scored here) and trained the new rows for {tide.get('trained_steps')} steps "
        f"(`tide extend` took {tide['seconds']} s of wall time in all, evaluation included){selection_words(tide)}; "
        f"its published optimizer.pt came from step "
        f"{carried.get('from_step')}, new rows' moments from {carried.get('new_rows_from')}. "
        "(b), (b') and (c) use TIDE's extended tokenizer byte for byte. TIDE's own before/after evaluation "
        "(its metrics.json, kept in the JSON as `metrics_comparison`) scores the same test split on the "
        "checkpoint's model as it is, before the run continues.",
        "",
        *([f"**At its defaults TIDE published nothing for this checkpoint**: `{tide['refused_at_defaults']['command']}` "
           f"ended with `{tide['refused_at_defaults']['refused']}` ({tide['refused_at_defaults']['seconds']} s). "
           "That is the product's guarantee at work: the run goes on with its own tokenizer, exactly as (d). "
           "To measure what the extension itself costs a run, (a) below is the same command with "
           "`--keep-all-terms` (every mined term, the last training step).", ""]
          if tide.get("refused_at_defaults") else []),
        f"Held-out bits per byte at K, before the extension (base tokenizer): **{before:.4f}**. "
        "Steps are counted from K and measured at the evaluation points "
        f"(K, K+{', K+'.join(s.strip() for s in cfg.eval_early.split(',') if s.strip())}, then every {cfg.eval_every}), "
        "so a step count is the first evaluation point at or below the value.",
        "",
        "| system | right after extension (K) | worst K..N | worst vs before | steps until back at or below before "
        "| bits/byte at N | at N vs before | at N vs (d) | steps to reach (b)'s value at N | held-out tokens/byte |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    control = summary["no_extension"]["at_n"] if "no_extension" in summary else None
    for system, s in summary.items():
        lines.append(
            f"| {labels[system]} | {s['at_k_after_extension']:.4f} | {s['worst']:.4f} (step {s['worst_step']}) "
            f"| {pct(s['worst_vs_before_pct'])} | {fmt(s['steps_back_to_before'], 'd', 'not by N')} "
            f"| {s['at_n']:.4f} | {pct(s['at_n_vs_before_pct'])} "
            f"| {pct(100 * (s['at_n'] / control - 1)) if control else '—'} | {fmt(s['steps_to_reach_b_at_n'], 'd', 'not by N')} "
            f"| {s['tokens_per_byte']:.4f} |"
        )
    lines += [
        "",
        "How far the old rows moved by step N (relative Frobenius norm of the change; max = largest "
        "absolute change of one weight). `vs K`: from the checkpoint; `vs (d)`: from the control run's "
        "weights at N. Every system trains the whole model, so old rows move in all of them; what differs "
        "is by how much the first steps after the extension push them. Wall times depend on what else the "
        "shared cores were running at the time: compare them loosely.",
        "",
        "| system | old rows vs K | max abs | old rows vs (d) at N | rest of the model vs K | rest vs (d) at N | continuation wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, d in drift.items():
        vs_d = "—" if system == "no_extension" else f"{d['old_rows_vs_control']:.5f}"
        body_d = "—" if system == "no_extension" else f"{d['body_vs_control']:.5f}"
        lines.append(f"| {labels[system]} | {d['old_rows_vs_k']:.5f} | {d['old_rows_max_abs_vs_k']:.5f} | {vs_d} "
                     f"| {d['body_vs_k']:.5f} | {body_d} | {results[system]['train_seconds']} |")

    tide_s = summary.get("tide")
    half = (cfg.n - cfg.k) / 2
    lines += ["", "## Targets", ""]
    if tide_s:
        met = tide_s["worst_vs_before_pct"] <= TARGET_WORST
        if tide.get("refused_at_defaults"):
            lines.append("- At its defaults TIDE published nothing, so the run was not disturbed at all (+0.00%): met, "
                         "but only because no token was added.")
        lines.append(f"- TIDE's worst value after the extension at most +1% over the value before"
                     f"{' (with --keep-all-terms)' if tide.get('refused_at_defaults') else ''}: "
                     f"{pct(tide_s['worst_vs_before_pct'])} — **{'met' if met else 'NOT met'}**.")
        if "hf_fresh_adam" in summary:
            reach = tide_s["steps_to_reach_b_at_n"]
            met = reach is not None and reach <= half
            lines.append(f"- (b)'s bits per byte at N ({summary['hf_fresh_adam']['at_n']:.4f}) reached by TIDE in at most "
                         f"half the {cfg.n - cfg.k} steps after the extension ({half:g}): "
                         f"{fmt(reach, 'd', 'not reached by N')} steps — **{'met' if met else 'NOT met'}**.")
    lines += ["", "## Bits per byte over steps", ""]
    if plotted:
        lines += [f"![bits per byte over steps]({cfg.out.with_suffix('.png').name})", ""]
    systems = list(results)
    header = "| step | shared run | " + " | ".join(f"({labels[s][1:labels[s].index(')')]})" for s in systems) + " |"
    lines += [header, "| ---: | ---: | " + " | ".join("---:" for _ in systems) + " |"]
    by_step: dict[int, dict[str, float]] = {}
    for p in base["series"]:
        by_step.setdefault(p["step"], {})["shared"] = p["bits_per_byte"]
    for s in systems:
        for p in results[s]["series"]:
            by_step.setdefault(p["step"], {})[s] = p["bits_per_byte"]
    for step in sorted(by_step):
        row = by_step[step]
        cells = [fmt(row.get(s), ".4f", "") for s in systems]
        lines.append(f"| {step} | {fmt(row.get('shared'), '.4f', '')} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Timing: the shared run to K took {base['train_seconds']} s of training; held-out scoring "
        f"({data['eval_bytes']:,} bytes a point) took {data['scoring_seconds']} s in all and is excluded from the "
        "continuation times above. The JSON next to this file holds every series, every training loss "
        "and TIDE's own report.",
        "",
    ]
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domain", choices=("es", "foldoc"), default="es")
    parser.add_argument("--k", type=int, default=40, help="step at which the vocabulary is extended")
    parser.add_argument("--n", type=int, default=120, help="last step")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-early", default="1,2,5", help="extra evaluation points, steps after K")
    parser.add_argument("--eval-bytes", type=int, default=10_000, help="held-out bytes scored at each point")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--row-bytes", type=int, default=400, help="bytes of text per training row")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tide-steps", type=int, default=DEFAULTS["steps"], help="TIDE's own steps over the new rows")
    parser.add_argument("--tide-eval-bytes", type=int, default=5000, help="TIDE's own before/after evaluation")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    # On 2 cores shared with other work, two OpenMP threads ran a step 2-4x slower than one
    # (threads spinning at barriers while the other is descheduled); results are the same.
    parser.add_argument("--threads", type=int, default=1, help="torch threads, here and in `tide extend`")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("TIDE_TEST_CACHE", REPO / ".cache")))
    parser.add_argument("--work", type=Path, help="work folder (default: a temporary one, removed)")
    parser.add_argument("--out", type=Path, default=RESULTS / "continue_training.md")
    parser.add_argument("--report-from", type=Path, help="rebuild the page and plot from this run's JSON, measure nothing")
    cfg = parser.parse_args()
    command = "nice -n 5 .venv/bin/python " + " ".join([str(Path(sys.argv[0]).resolve().relative_to(REPO))] + sys.argv[1:])
    if cfg.report_from:
        rebuild(cfg.report_from, cfg.out if "--out" in sys.argv else None, command.removeprefix("nice -n 5 "))
        return
    systems = [s for s in cfg.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown or not systems:
        parser.error(f"--systems: unknown {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    if not 0 < cfg.k < cfg.n:
        parser.error("need 0 < --k < --n")
    if "tide" in systems and "hf_fresh_adam" not in systems:
        print("note: without hf_fresh_adam there is no (b) value to reach", flush=True)

    from transformers.utils import logging as hf_logging

    from extension.plan.models import ModelSources, resolve_model

    hf_logging.set_verbosity_error()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    base_path = Path(resolve_model("smollm2-135m", ModelSources(cache_dir=cfg.cache)).path)
    work = cfg.work or Path(tempfile.mkdtemp(prefix="tide-continue-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        all_docs, train_docs, held_out = split(cfg.domain)
        rows = pack_rows(train_docs, cfg.row_bytes)
        corpus = work / f"{cfg.domain}.jsonl"
        corpus.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in all_docs), encoding="utf-8")
        scorer = Scorer(held_out, cfg.eval_bytes)
        data = {"documents": len(all_docs), "split": "product", "train_bytes": sum(len(d.encode()) for d in train_docs),
                "held_out_bytes": sum(len(d.encode()) for d in held_out), "rows": len(rows)}

        print(f"base run to step {cfg.k} ({len(rows)} rows)", flush=True)
        base = base_run(cfg, base_path, rows, scorer, work / "run")
        checkpoint = base["checkpoint"]
        before = base["series"][-1]["bits_per_byte"]
        data["eval_bytes"] = base["series"][-1]["bytes"]
        k_model, _ = load(checkpoint)
        base_vocab = base["base_vocab_size"]
        k_rows, k_body = vocab_rows(k_model, base_vocab), body(k_model)
        del k_model

        print("tide extend (a)", flush=True)
        tide = tide_extend(cfg, checkpoint, corpus, work / "tide", cfg.tide_steps, work / "tide.log")
        print(f"  {tide['seconds']} s", flush=True)
        refused, labels = None, dict(LABELS)
        if "refused" in tide:
            # At its defaults TIDE would leave the run unextended: measure what every term costs.
            refused = tide
            print(f"  refused: {refused['refused'][:200]}\ntide extend --keep-all-terms (a)", flush=True)
            tide = tide_extend(cfg, checkpoint, corpus, work / "tide", cfg.tide_steps, work / "tide-keep-all.log",
                               ("--keep-all-terms",))
            print(f"  {tide['seconds']} s", flush=True)
            labels["tide"] = "(a) TIDE (`tide extend --keep-all-terms` on the checkpoint, resumed)"
        print("untrained rows from (a)'s folder (c)", flush=True)
        subword = untrained_rows_checkpoint(checkpoint, work / "tide", work / "subword_mean")
        folders = {"tide": work / "tide", "subword_mean_kept": work / "subword_mean", "no_extension": checkpoint}
        if "hf_fresh_adam" in systems:
            hf_checkpoint(checkpoint, work / "tide", work / "hf_fresh_adam", keep_schedule=True)
            folders["hf_fresh_adam"] = work / "hf_fresh_adam"
        if "hf_fresh_trainer" in systems:
            hf_checkpoint(checkpoint, work / "tide", work / "hf_fresh_trainer", keep_schedule=False)
            folders["hf_fresh_trainer"] = work / "hf_fresh_trainer"

        results: dict[str, dict] = {}
        finals: dict[str, tuple[dict, dict]] = {}
        order = ["no_extension"] + [s for s in SYSTEMS if s != "no_extension"]  # the control first
        for system in [s for s in order if s in systems]:
            print(f"{system}: steps {cfg.k} -> {cfg.n}", flush=True)
            fresh = system in ("hf_fresh_adam", "hf_fresh_trainer")
            results[system], model = continue_run(cfg, system, folders[system], rows, scorer, work / f"run-{system}", fresh)
            finals[system] = (vocab_rows(model, base_vocab), body(model))
            del model
            gc.collect()

        drift = {}
        for system, (old_rows, rest) in finals.items():
            d = {"old_rows_vs_k": relative(old_rows, k_rows, k_rows),
                 "old_rows_max_abs_vs_k": max(float((old_rows[r] - k_rows[r]).abs().max()) for r in old_rows),
                 "body_vs_k": relative(rest, k_body, k_body)}
            if "no_extension" in finals and system != "no_extension":
                d["old_rows_vs_control"] = relative(old_rows, finals["no_extension"][0], k_rows)
                d["body_vs_control"] = relative(rest, finals["no_extension"][1], k_body)
            drift[system] = d
        data["scoring_seconds"] = round(scorer.seconds, 1)
        summary = summarise(cfg, before, results)
        payload = {
            "command": command, "date": date.today().isoformat(),
            "machine": {"arch": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__}, "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(cfg).items()},
            "data": data, "before": before, "base_run": {k: v for k, v in base.items() if k != "checkpoint"},
            "tide": {"seconds": tide["seconds"], "command": tide["command"], "refused_at_defaults": refused,
                     "counts": tide["extension"].get("counts"), "vocab": tide["extension"].get("vocab"),
                     "trained_steps": tide["extension"].get("trained_steps"),
                     "trainer_checkpoint": tide["extension"].get("trainer_checkpoint"),
                     "selection": selection_summary(tide["extension"]),
                     "metrics_comparison": tide["metrics"].get("comparison"),
                     "terms": [t["term"] for t in tide["extension"].get("terms", [])]},
            "subword_mean": subword,
            "systems": {s: {**results[s], "summary": summary[s], "drift": drift[s], "label": labels[s]} for s in results},
            "total_seconds": round(time.perf_counter() - started, 1),
        }
        cfg.out.parent.mkdir(parents=True, exist_ok=True)
        cfg.out.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
        write_report(cfg, payload)
    finally:
        if cfg.work is None:
            shutil.rmtree(work, ignore_errors=True)


def write_report(cfg, payload: dict, rebuilt_by: str | None = None) -> None:
    plotted = plot(cfg.out.with_suffix(".png"), cfg, payload)
    text = report(cfg, payload, plotted, rebuilt_by)
    cfg.out.write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {cfg.out} (+ .json{', .png' if plotted else ''}); the run took {payload['total_seconds']} s")


def rebuild(path: Path, out: Path | None, command: str) -> None:
    """The page and the plot again from a run's JSON (its settings, series and drift), nothing re-measured."""
    payload = json.loads(path.read_text(encoding="utf-8"))
    if "date" not in payload:  # runs before the JSON recorded it: the JSON file's own date
        payload["date"] = date.fromtimestamp(path.stat().st_mtime).isoformat()
    cfg = argparse.Namespace(**payload["config"])
    cfg.out = out or path.with_suffix(".md")
    write_report(cfg, payload, rebuilt_by=command)


if __name__ == "__main__":
    main()
