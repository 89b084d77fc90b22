"""Distil the new tokens' INPUT rows before training (option `init` 'distill', 'subword_mean_distill').

AweDist (Dobler, Elliott, de Melo, arXiv 2505.20133): a new token's input row should make the
model read the text after it as it reads the text after the token's ORIGINAL pieces. For short
contexts around each new token, the teacher is the frozen base model reading the pieces, the
student the same model reading the new token; the input rows are trained so that the student's
final hidden states (the head's input) at the new token and every position after it match the
teacher's at the aligned positions (the last piece of each token). Only the input rows move (with,
on Gemma 3n, the per-layer rows the same ids look up): the
loss never touches the head, so an untied model's output rows keep their init, and a tied row is
moved only through the path that reads it; the training that follows (next-token loss) then
trains both sides as usual. But a tied row IS the head's row: moved for its input side alone it takes
probability wherever the model's states point its way, and with no training after it (a terms-only
job of 0 steps) nothing takes that back. 'subword_mean_distill' therefore adds a penalty on the
change of every new row's logit at the hidden states the base model produces on the contexts
(batch_loss's `logit_penalty`): the mean row's logits, which were fine, stay; the input side moves
in the directions those states do not read.

The team's own decomposition (benchmarks/results/init_methods.md) puts most of the remaining loss
on the old token read right after a new one: the input side of the new row, which this targets.
The contexts are cheap to get: a corpus job's training windows around each occurrence of a new
id, a terms-only job's generated contexts. No vocabulary-sized matmul is needed, so a step costs
a forward pass of the teacher and a forward and backward pass of the student over short contexts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .term_contexts import expand
from ..rows.init import NewRows
from ..rows.adapter import RowsAdapter

DISTILLED_NAME = "distilled_rows.pt"  # in a job's work folder, beside the training checkpoint

TOKENS_BEFORE = 8  # context read before the new token (the teacher's state when it arrives)
TOKENS_AFTER = 16  # positions after it whose hidden states are matched
BATCH_CONTEXTS = 32
EPOCHS = 1
# init 'subword_mean_distill' (a terms-only job of 0 steps): the weight of batch_loss's penalty on
# the change of the new rows' logits, and the passes over its few contexts (4 per term on a CPU).
# Chosen on the Spanish and FOLDOC glossaries of benchmarks/terms_only.py with a one-off sweep
# (weights 10, 100, 1000 at 4 passes, and 100 at 1 pass; its figures are in issue 39's notes):
# 100 was best on Spanish and within 0.0001 bits per byte of the best on FOLDOC, and 4 passes beat
# 1. 16 passes then beat 4 on both glossaries, for about 4x the distillation's minutes
# (benchmarks/results/terms_only_{es,foldoc}_mean_distill16.md against *_mean_distill.md). What the
# product then does on all five domains: docs/measured.md, terms-only training.
HELD_LOGITS_PENALTY = 100.0
HELD_LOGITS_EPOCHS = 16


@dataclass
class DistillationReport:
    contexts: int
    steps: int
    seconds: float
    loss_first: float | None
    loss_last: float | None
    epochs: int = EPOCHS
    logit_penalty: float = 0.0  # 0 where none applied (untied rows, or not asked)

    def to_json(self) -> dict:
        return {"contexts": self.contexts, "steps": self.steps, "seconds": round(self.seconds, 2),
                "loss_first": self.loss_first, "loss_last": self.loss_last, "epochs": self.epochs,
                "logit_penalty": self.logit_penalty,
                "method": "AweDist-style hidden-state distillation of the input rows (arXiv 2505.20133)"}


def window_contexts(tokens: torch.Tensor, base_vocab_size: int, *, per_token: int,
                    before: int = TOKENS_BEFORE, after: int = TOKENS_AFTER, seed: int = 0) -> list[list[int]]:
    """Up to `per_token` slices of a token stream around occurrences of each new id (chosen at
    random among its occurrences), each from `before` tokens before it to `after` after it."""
    positions = torch.nonzero(tokens >= base_vocab_size).flatten()
    if not len(positions):
        return []
    generator = torch.Generator().manual_seed(seed)
    order = positions[torch.randperm(len(positions), generator=generator)]
    taken: dict[int, int] = {}
    contexts = []
    for position in order.tolist():
        token = int(tokens[position])
        if taken.get(token, 0) >= per_token:
            continue
        taken[token] = taken.get(token, 0) + 1
        start, end = max(0, position - before), min(tokens.numel(), position + after + 1)
        contexts.append(tokens[start:end].tolist())
    return contexts


def contexts_of(objective, base_vocab_size: int, *, per_token: int, seed: int = 0) -> list[list[int]]:
    """Student ids around the new tokens from a job's training data: corpus windows
    (train.TokenWindows, up to `per_token` per new id) or generated term contexts
    (distill.TermContextObjective: each one already is a context of its term)."""
    if hasattr(objective, "tokens"):
        return window_contexts(objective.tokens, base_vocab_size, per_token=per_token, seed=seed)
    contexts = []
    for context in getattr(objective, "contexts", []):
        ids = context.student
        first = next((j for j, token in enumerate(ids) if token >= base_vocab_size), None)
        if first is not None:
            contexts.append(ids[max(0, first - TOKENS_BEFORE): first + TOKENS_AFTER + 1])
    return contexts


def batch_loss(adapter: RowsAdapter, batch: list[list[int]], pieces: dict[int, list[int]], pad: int, *,
               logit_penalty: float = 0.0, start: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared distance between student and teacher final hidden states, per matched
    position, over the positions from each context's first new token on.

    With `logit_penalty` (tied rows only): plus that weight times the mean squared change, since
    `start`, of every new row's logit at every teacher position of the batch. A tied row is also
    the head's row, so an input row moved freely takes probability at positions where the term is
    not the answer (benchmarks/results/terms_only_foldoc_td25.md); the penalty keeps the logits
    where the start put them, at the hidden states the model actually produces, and leaves the
    input side free in the directions those states do not read."""
    device = adapter.input_rows.device
    base = adapter.base_vocab_size
    taught = [expand(ids, base, pieces) for ids in batch]

    def padded(rows: list[list[int]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)

    student = padded(batch)  # right padding: causal attention never reads the pads
    with torch.no_grad():
        teacher_hidden = adapter.hidden(padded([t.teacher for t in taught])).float()
    student_hidden = adapter.hidden(student).float()
    rows, student_at, teacher_at = [], [], []
    for b, (ids, context) in enumerate(zip(batch, taught)):
        first = next(j for j, token in enumerate(ids) if token >= base)
        for j in range(first, len(ids)):
            rows.append(b)
            student_at.append(j)
            teacher_at.append(context.last_piece[j])
    rows_t = torch.tensor(rows, device=student_hidden.device)
    got = student_hidden[rows_t, torch.tensor(student_at, device=student_hidden.device)]
    want = teacher_hidden[rows_t, torch.tensor(teacher_at, device=teacher_hidden.device)]
    loss = (got - want).square().sum(-1).mean()
    if logit_penalty and start is not None:
        read = torch.cat([teacher_hidden[b, : len(context.teacher)] for b, context in enumerate(taught)])
        loss = loss + logit_penalty * (read @ (adapter.input_rows - start).T).square().mean()
    return loss


def distill_input_rows(adapter: RowsAdapter, contexts: list[list[int]], pieces: dict[int, list[int]], *, lr: float,
                       pad: int, seed: int = 0, batch_contexts: int = BATCH_CONTEXTS, epochs: int = EPOCHS,
                       logit_penalty: float = 0.0, should_cancel=None, on_progress=None) -> DistillationReport:
    """Train the attached adapter's input rows in place (Adam, `lr`, constant) on `contexts`
    (student ids, each holding at least one new id); every other parameter stays frozen.
    `pieces`: new id -> its original base ids. `logit_penalty`: batch_loss's, on tied rows only
    (an untied model's head rows are not moved by this at all)."""
    started = time.perf_counter()
    contexts = [c for c in contexts if any(token >= adapter.base_vocab_size for token in c)]
    if not contexts:
        return DistillationReport(0, 0, time.perf_counter() - started, None, None)
    # the input side: the input rows and, on Gemma 3n, the per-layer rows the same ids look up
    inputs = [p for p in (adapter.input_rows, getattr(adapter, "per_layer_rows", None)) if p is not None]
    optimizer = torch.optim.Adam(inputs, lr=lr)
    frozen = [p for p in adapter.parameters() if all(p is not q for q in inputs) and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    start = adapter.input_rows.detach().clone() if logit_penalty and adapter.tied else None
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    total = epochs * -(-len(contexts) // batch_contexts)
    try:
        for _ in range(epochs):
            order = torch.randperm(len(contexts), generator=generator).tolist()
            for first in range(0, len(order), batch_contexts):
                if should_cancel is not None and should_cancel():
                    from ..errors import JobCancelled

                    raise JobCancelled("cancelled while distilling the new input rows")
                batch = [contexts[i] for i in order[first:first + batch_contexts]]
                loss = batch_loss(adapter, batch, pieces, pad, logit_penalty=logit_penalty, start=start)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                if on_progress is not None:
                    on_progress(len(losses), total)
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return DistillationReport(len(contexts), len(losses), time.perf_counter() - started, losses[0], losses[-1], epochs,
                              logit_penalty if start is not None else 0.0)


def save_distilled(work_dir, key: dict, rows: NewRows, report: dict) -> None:
    """Keep the distilled rows in `work_dir` (nothing without one), written atomically."""
    if work_dir is None:
        return
    path = Path(work_dir) / DISTILLED_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"key": key, "input": rows.input.cpu(), "output": None if rows.output is None else rows.output.cpu(),
                "output_bias": None if rows.output_bias is None else rows.output_bias.cpu(),
                "per_layer": None if rows.per_layer is None else rows.per_layer.cpu(), "report": report}, tmp)
    os.replace(tmp, path)


def load_distilled(work_dir, key: dict) -> tuple[NewRows, dict] | None:
    """(rows, report) kept by save_distilled for the same `key` (base model, new tokens, data and
    distillation settings), else None."""
    path = Path(work_dir) / DISTILLED_NAME if work_dir is not None else None
    if path is None or not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("key") != key:
        return None
    return NewRows(state["input"], state["output"], state["output_bias"], state.get("per_layer")), state["report"]
