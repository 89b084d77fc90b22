"""Train only the new rows: a small nanoGPT-style loop over a `RowsAdapter`.

AdamW over the adapter's parameters (never the base), linear warmup then cosine decay to 10%,
gradient clipping, and a seed that makes CPU runs bit-reproducible. Batches are a pure function
of (seed, step), so a checkpoint only needs the rows, the optimizer state and the step: resuming
from it gives exactly the rows an uninterrupted run gives.

What a step trains on is an objective with `loss(adapter, step) -> (summed loss, count)`:
`TokenWindows` (next-token loss on a token stream, for corpus jobs) lives here;
`extension.training.term_contexts` builds the terms-only objective.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Protocol

import torch

from ..errors import InvalidCorpusError, InvalidOptionError, JobCancelled
from ..rows.init import NewRows
from ..plan.options import DEFAULTS, check_options
from ..rows.adapter import RowsAdapter
from ..plan.spec import Callbacks

CHECKPOINT_NAME = "rows_checkpoint.pt"
# Why training ended (TrainResult.stopped, metrics "training.stopped"): it ran every step, its time
# budget ran out, validation stopped improving, or the job was cancelled (then only the checkpoint
# records it: a cancelled job publishes nothing).
STOP_REASONS = ("steps", "time_budget", "validation_stalled", "cancelled")
# Settings that say when to stop, not what a step computes: a checkpoint made under other values is
# still this run's, so a job resumed with a bigger budget continues.
_NOT_IN_RUN_KEY = ("checkpoint_every", "max_train_seconds", "validation_patience")
SAMPLING_MODES = ("centred", "sequential", "mixed")
# Chosen by measurement on SmolLM2 + FOLDOC (benchmarks/results/window_sampling.md): centred
# windows reached in 16 steps a held-out quality sequential windows had not reached in 48, for
# +0.02% general-text bits per byte. Terms-only: distillation keeps general text closest to the
# base model (benchmarks/results/terms_only_training.md).
DEFAULT_SAMPLING = "centred"


@dataclass
class TrainConfig:
    """The training options a run uses (defaults and ranges: extension/plan/options.py)."""

    steps: int = DEFAULTS["steps"]
    batch_size: int = DEFAULTS["batch_size"]
    seq_len: int = DEFAULTS["seq_len"]
    lr: float = DEFAULTS["lr"]
    embedding_lr_multiplier: float = DEFAULTS["embedding_lr_multiplier"]
    weight_decay: float = DEFAULTS["weight_decay"]
    warmup_steps: int = DEFAULTS["warmup_steps"]
    grad_clip: float = DEFAULTS["grad_clip"]
    seed: int = DEFAULTS["seed"]
    checkpoint_every: int = DEFAULTS["checkpoint_every"]
    max_train_seconds: int = DEFAULTS["max_train_seconds"]
    validation_patience: int = DEFAULTS["validation_patience"]
    betas: tuple[float, float] = (0.9, 0.95)
    min_lr_ratio: float = 0.1

    @classmethod
    def from_spec(cls, spec) -> "TrainConfig":
        names = {f for f in cls.__dataclass_fields__}
        values = {name: getattr(spec, name) for name in names if hasattr(spec, name)}
        unset = sorted(name for name, value in values.items() if value is None)
        if unset:  # a caller's mistake, not the user's: run() fills these in from the job's device
            raise ValueError(f"{', '.join(unset)} still unset: fill in extension.plan.options.defaults_for_device first")
        return cls(**values)

    def validate(self, *, max_positions: int | None = None) -> "TrainConfig":
        """Raise InvalidOptionError naming the option and its valid range; with `max_positions`,
        also check that a training sequence fits the model's context."""
        check_options(self)
        if max_positions is not None and self.seq_len > max_positions:
            raise InvalidOptionError(
                option="seq_len",
                problem=f"must be at most the model's context of {max_positions} positions, got {self.seq_len}",
            )
        return self

    def lr_at(self, step: int) -> float:
        """Base learning rate for 0-based `step`: linear warmup, then cosine down to min_lr_ratio."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(1, self.steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        floor = self.lr * self.min_lr_ratio
        return floor + 0.5 * (1 + math.cos(math.pi * progress)) * (self.lr - floor)


class Objective(Protocol):
    def loss(self, adapter: RowsAdapter, step: int) -> tuple[torch.Tensor, int]:
        """Summed loss of step `step`'s batch and how many targets it scored (a pure function
        of the step, so resuming replays the same batches)."""


@dataclass
class TrainResult:
    history: list[dict]
    steps_done: int
    rows: NewRows  # the published rows: the best validated step's when there was validation
    resumed_from: int = 0
    optimizer_state: dict | None = field(default=None, repr=False)  # of those rows, for optimizer_state.py
    best_step: int | None = None  # the step whose rows these are (0 = the init); None: no validation
    validation: list[dict] = field(default_factory=list)  # [{step, bits_per_byte}]
    seconds: dict = field(default_factory=dict)  # {"training": s, "validation": s}
    stopped: str = "steps"  # one of STOP_REASONS
    planned_steps: int = 0  # config.steps: steps_done is fewer when training stopped early
    limits: dict = field(default_factory=dict)  # {max_train_seconds, validation_patience} the run stopped by

    def report(self) -> dict:
        """How training ended, for metrics and tide_extension.json ("training")."""
        return {"steps": self.steps_done, "planned_steps": self.planned_steps, "stopped": self.stopped, **self.limits}


class StepValidation(Protocol):
    """What train_rows asks of a validation scorer (extension.selection builds one)."""

    def due(self, step: int) -> bool: ...

    def __call__(self, adapter: RowsAdapter) -> float: ...


class _BestRows:
    """The rows and optimizer state of the best-scoring step so far (ties keep the earlier step:
    fewer steps for the same score). Step 0's optimizer state is None: no moments yet."""

    def __init__(self, saved: dict | None = None):
        saved = saved or {}
        self.step, self.score = saved.get("step"), saved.get("score", float("inf"))
        self.rows, self.optimizer_state = saved.get("rows"), saved.get("optimizer_state")
        self.history: list[dict] = list(saved.get("history", []))
        self.seconds: float = saved.get("seconds", 0.0)

    def consider(self, step: int, adapter: RowsAdapter, optimizer, validate: StepValidation) -> None:
        began = time.perf_counter()
        score = validate(adapter)
        self.seconds += time.perf_counter() - began
        self.history.append({"step": step, "bits_per_byte": score})
        if score < self.score:
            self.step, self.score, self.rows = step, score, adapter.rows()
            self.optimizer_state = copy.deepcopy(optimizer.state_dict()) if step > 0 else None

    def checks_since_best(self) -> int:
        """Validation checks after the best one (none yet: 0)."""
        steps = [entry["step"] for entry in self.history]
        return len(steps) - 1 - steps.index(self.step) if self.step in steps else 0

    def to_state(self) -> dict:
        return {"step": self.step, "score": self.score, "rows": self.rows, "optimizer_state": self.optimizer_state,
                "history": self.history, "seconds": self.seconds}


def param_groups(adapter: RowsAdapter, config: TrainConfig) -> list[dict]:
    """The AdamW groups of the new rows (public: the learning-rate rule is worth testing alone).

    Input rows get sparse gradients (only where their token occurs): higher LR. Untied output
    rows see a gradient at every position, like any other dense weight: base LR."""
    groups = [{"params": [adapter.input_rows], "lr_scale": config.embedding_lr_multiplier, "name": "input_rows"}]
    dense = [p for p in (adapter.output_rows, adapter.output_bias) if p is not None]
    if dense:
        groups.append({"params": dense, "lr_scale": 1.0, "name": "output_rows"})
    if getattr(adapter, "per_layer_rows", None) is not None:
        # Gemma 3n's per-layer rows are looked up by token id like the input rows: sparse, same LR. A
        # group of their own, last, so the groups above keep their places (optimizer_state reads them).
        groups.append({"params": [adapter.per_layer_rows], "lr_scale": config.embedding_lr_multiplier,
                       "name": "per_layer_rows"})
    for group in groups:
        group["weight_decay"] = config.weight_decay
    return groups


def train_rows(
    model,
    adapter: RowsAdapter,
    objective: Objective,
    config: TrainConfig,
    callbacks: Callbacks | None = None,
    *,
    identity: dict | None = None,
    validate: StepValidation | None = None,
) -> TrainResult:
    """Train `adapter`'s rows for config.steps, or fewer when the time budget
    (config.max_train_seconds) runs out or validation stops improving (config.validation_patience
    checks without a better score); TrainResult.stopped says which. Resumes from callbacks.work_dir when it holds a
    checkpoint of the same run: same settings, same training data (`objective.fingerprint()`)
    and same `identity` (`run_identity`: the base model and the new tokens), so a reused work
    folder never resumes rows made for other terms or another model. Raises JobCancelled (after
    checkpointing) when should_cancel()."""
    if adapter.model is not model:
        raise ValueError("the adapter is attached to a different model")
    callbacks = callbacks or Callbacks()
    config.validate()
    torch.manual_seed(config.seed)
    optimizer = torch.optim.AdamW(param_groups(adapter, config), lr=config.lr, betas=config.betas, eps=1e-8)
    checkpoint = Path(callbacks.work_dir) / CHECKPOINT_NAME if callbacks.work_dir else None
    key = _run_key(adapter, config, objective, identity)
    start, history, best = _resume(checkpoint, key, adapter, optimizer, callbacks)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if validate is not None and start == 0:
        best.consider(0, adapter, optimizer, validate)
    training_seconds = sum(record.get("seconds", 0.0) for record in history)

    steps_done, stopped = start, "steps"
    for step in range(start, config.steps):
        stopped = _stop_reason(config, training_seconds + best.seconds, best if validate is not None else None)
        if stopped != "steps":
            break
        if callbacks.should_cancel():
            _save(checkpoint, key, adapter, optimizer, step, history, best, stopped="cancelled")
            raise JobCancelled(f"cancelled before training step {step + 1} of {config.steps}")
        record = _train_step(adapter, optimizer, objective, config, params, step)
        training_seconds += record["seconds"]
        history.append(record)
        steps_done = step + 1
        if validate is not None and validate.due(step + 1):
            best.consider(step + 1, adapter, optimizer, validate)
        callbacks.on_progress(step + 1, config.steps, {k: record[k] for k in ("loss", "tokens_per_s", "lr")})
        if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0 and step + 1 < config.steps:
            _save(checkpoint, key, adapter, optimizer, step + 1, history, best)
    if stopped != "steps" and validate is not None and best.history and best.history[-1]["step"] != steps_done:
        best.consider(steps_done, adapter, optimizer, validate)  # the rows it stopped with get their chance
    _save(checkpoint, key, adapter, optimizer, steps_done, history, best, stopped=stopped)
    seconds = {"training": round(training_seconds, 3), "validation": round(best.seconds, 3)}
    ended = dict(steps_done=steps_done, resumed_from=start, seconds=seconds, stopped=stopped, planned_steps=config.steps,
                 limits={"max_train_seconds": config.max_train_seconds, "validation_patience": config.validation_patience})
    if validate is None or best.step is None:
        return TrainResult(history=history, rows=adapter.rows(), optimizer_state=optimizer.state_dict(), **ended)
    return TrainResult(history=history, rows=best.rows, optimizer_state=best.optimizer_state, best_step=best.step,
                       validation=best.history, **ended)


def _stop_reason(config: TrainConfig, spent_seconds: float, best: _BestRows | None) -> str:
    """Why training should stop before its next step ("steps": it should not). Checked before a
    step rather than after, so a job resumed under the same budget takes no extra step."""
    if spent_seconds >= config.max_train_seconds:
        return "time_budget"
    if best is not None and config.validation_patience and best.checks_since_best() >= config.validation_patience:
        return "validation_stalled"
    return "steps"


def _train_step(adapter: RowsAdapter, optimizer, objective, config: TrainConfig, params: list, step: int) -> dict:
    """One optimizer step on step `step`'s batch; returns its history record."""
    began = time.perf_counter()
    lr = config.lr_at(step)
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
    total, count = objective.loss(adapter, step)
    loss = total / max(count, 1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip if config.grad_clip > 0 else float("inf"))
    optimizer.step()
    elapsed = time.perf_counter() - began
    return {
        "step": step + 1,
        "loss": float(loss.detach()),
        "lr": lr,
        "grad_norm": float(grad_norm),
        "tokens": count,
        "tokens_per_s": count / elapsed if elapsed > 0 else 0.0,
        "seconds": elapsed,
    }


# -- checkpoints ------------------------------------------------------------------------------
def _run_key(adapter: RowsAdapter, config: TrainConfig, objective, identity: dict | None) -> dict:
    """What must match for a checkpoint to belong to this run. `steps` is part of it because the
    learning-rate schedule depends on the total; what says only when to stop (_NOT_IN_RUN_KEY)
    may change on a re-run."""
    key = asdict(config)
    for name in _NOT_IN_RUN_KEY:
        key.pop(name)
    key["betas"] = list(key["betas"])
    key["rows"] = [list(p.shape) for p in adapter.parameters()]
    key["base_vocab_size"] = adapter.base_vocab_size
    key["data"] = objective.fingerprint() if hasattr(objective, "fingerprint") else None
    key.update(identity or {})
    return key


def _save(path: Path | None, key: dict, adapter, optimizer, step: int, history: list[dict], best: _BestRows,
          stopped: str | None = None) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step,
        "key": key,
        "params": [p.detach().cpu().clone() for p in adapter.parameters()],
        "optimizer": optimizer.state_dict(),
        "history": history,
        "best": best.to_state(),
        "stopped": stopped,  # None: saved mid-run
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-save leaves the previous checkpoint intact


def _resume(path: Path | None, key: dict, adapter, optimizer, callbacks: Callbacks) -> tuple[int, list[dict], _BestRows]:
    if path is None or not path.exists():
        return 0, [], _BestRows()
    state = torch.load(path, map_location="cpu", weights_only=False)
    saved = state.get("key") or {}
    if saved != key:
        differ = sorted(name for name in set(saved) | set(key) if saved.get(name) != key.get(name))
        callbacks.on_warning(
            "the work folder holds a checkpoint of another run (it differs in: " + ", ".join(differ)
            + "); starting fresh and replacing it"
        )
        callbacks.on_event("train_fresh_start", {"differs_in": differ})
        return 0, [], _BestRows()
    with torch.no_grad():
        for param, saved_param in zip(adapter.parameters(), state["params"]):
            param.copy_(saved_param)
    optimizer.load_state_dict(state["optimizer"])
    # The checkpoint's name, never its path: events reach the service's clients.
    callbacks.on_event("train_resumed", {"step": state["step"], "checkpoint": path.name})
    return state["step"], list(state["history"]), _BestRows(state.get("best"))


# -- corpus data ------------------------------------------------------------------------------
def tokenize_documents(documents: Iterable[str], tokenizer, *, max_tokens: int, batch_docs: int = 256) -> torch.Tensor:
    """One token stream (int64) of the documents, each separated by EOS, up to max_tokens."""
    eos = tokenizer.eos_token_id
    pieces: list[torch.Tensor] = []
    have = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal have
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            row = ids + ([eos] if eos is not None else [])
            pieces.append(torch.tensor(row, dtype=torch.long))
            have += len(row)
        batch.clear()

    for document in documents:
        batch.append(document)
        if len(batch) >= batch_docs:
            flush()
            if have >= max_tokens:
                break
    if batch and have < max_tokens:
        flush()
    stream = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
    return stream[:max_tokens]


def window_prefix(tokenizer) -> list[int]:
    """[BOS] when the tokenizer starts every text with it (Gemma depends on it), else []."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return []
    probe = tokenizer("a")["input_ids"]
    return [bos] if probe and probe[0] == bos else []


class TokenWindows:
    """Next-token loss on windows of a token stream.

    sampling="sequential": consecutive windows in stream order (wrapping around).
    sampling="centred": each window is centred (with jitter) on an occurrence of a new id, so
    every window trains the new rows on both sides: predicting the token and reading it.
    sampling="mixed": half of each batch centred, half sequential — general text keeps teaching
    the output rows where the new tokens should NOT be predicted.
    """

    def __init__(self, tokens: torch.Tensor, *, base_vocab_size: int, batch_size: int, seq_len: int,
                 seed: int = 0, sampling: str = DEFAULT_SAMPLING, prefix: list[int] | None = None):
        if sampling not in SAMPLING_MODES:
            raise InvalidOptionError(f"window sampling {sampling!r} is not one of {', '.join(SAMPLING_MODES)}", param="sampling")
        self.prefix = torch.tensor(prefix or [], dtype=torch.long)
        self.body = seq_len + 1 - len(self.prefix)  # tokens taken from the stream per window
        needed = batch_size * self.body
        if tokens.numel() < needed:
            raise InvalidCorpusError(
                f"the training part of the corpus has {tokens.numel()} tokens, too few for one batch of "
                f"batch_size {batch_size} x seq_len {seq_len} (needs {needed}); give a larger corpus "
                "or lower batch_size / seq_len",
                param="corpus",
            )
        self.tokens = tokens
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.occurrences = torch.nonzero(tokens >= base_vocab_size).flatten()
        self.sampling = sampling if len(self.occurrences) else "sequential"
        self.windows = (tokens.numel() - 1) // self.body  # sequential windows per pass
        self._cached_order: tuple[int, torch.Tensor | None] = (-1, None)

    def fingerprint(self) -> str:
        """A digest of the training data and how it is sampled (part of a checkpoint's key)."""
        digest = hashlib.sha256(self.tokens.numpy().tobytes())
        digest.update(json.dumps([self.sampling, self.prefix.tolist(), self.body]).encode())
        return digest.hexdigest()[:16]

    def _generator(self, index: int, stream: int) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed((self.seed * 1_000_003 + index) * 8 + stream)
        return g

    def _order(self, epoch: int) -> torch.Tensor:
        if self._cached_order[0] != epoch:  # a new shuffle of the occurrences per pass
            self._cached_order = (epoch, torch.randperm(len(self.occurrences), generator=self._generator(epoch, 2)))
        return self._cached_order[1]

    def _sequential_starts(self, step: int, count: int, offset: int = 0) -> list[int]:
        first = step * count + offset
        return [((first + i) % self.windows) * self.body for i in range(count)]

    def _centred_starts(self, step: int, count: int) -> list[int]:
        occ = len(self.occurrences)
        starts = []
        jitter = torch.randint(-(self.body // 4), self.body // 4 + 1, (count,), generator=self._generator(step, 1))
        for i in range(count):
            index = step * count + i
            epoch, slot = divmod(index, occ)
            centre = int(self.occurrences[self._order(epoch)[slot]])
            start = centre - self.body // 2 + int(jitter[i])
            starts.append(min(max(start, 0), self.tokens.numel() - self.body))
        return starts

    def starts(self, step: int) -> list[int]:
        if self.sampling == "sequential":
            return self._sequential_starts(step, self.batch_size)
        if self.sampling == "centred":
            return self._centred_starts(step, self.batch_size)
        centred = self.batch_size // 2 or 1
        return self._centred_starts(step, centred) + self._sequential_starts(step, self.batch_size - centred)

    def batch(self, step: int) -> torch.Tensor:
        """[batch, seq_len + 1] token ids; inputs are [:, :-1], targets [:, 1:]."""
        rows = [torch.cat([self.prefix, self.tokens[s : s + self.body]]) for s in self.starts(step)]
        return torch.stack(rows)

    def loss(self, adapter: RowsAdapter, step: int) -> tuple[torch.Tensor, int]:
        window = self.batch(step).to(adapter.input_rows.device)
        hidden = adapter.hidden(window[:, :-1])
        return adapter.loss_sum(hidden, window[:, 1:])


def corpus_windows(corpus_path: Path, tokenizer, *, base_vocab_size: int, config: TrainConfig,
                   sampling: str = DEFAULT_SAMPLING, text_field: str = "text", max_tokens: int | None = None) -> TokenWindows:
    """TokenWindows over the corpus's TRAIN documents (the split mining and evaluation share),
    tokenised with the extended tokenizer. Reads only as much as the run can use."""
    from ..plan.corpus import train_documents

    budget = max_tokens or min(20_000_000, max(1_000_000, 4 * config.steps * config.batch_size * config.seq_len))
    tokens = tokenize_documents(train_documents(Path(corpus_path), text_field=text_field), tokenizer, max_tokens=budget)
    return TokenWindows(tokens, base_vocab_size=base_vocab_size, batch_size=config.batch_size,
                        seq_len=config.seq_len, seed=config.seed, sampling=sampling, prefix=window_prefix(tokenizer))


def max_positions(model) -> int | None:
    config = getattr(model.config, "text_config", None) or model.config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)

