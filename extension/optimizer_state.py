"""Carry a Hugging Face Trainer checkpoint's AdamW state over to the extended model.

Because the new rows were trained in their own parameters, the user's optimizer state for the
old parameters is still valid. When the base model folder is a Trainer checkpoint
(`optimizer.pt` + `trainer_state.json`), the published folder gets an `optimizer.pt` whose
embedding / lm_head moments are resized: old rows' `exp_avg` / `exp_avg_sq` bit-identical, new
rows' from the adapter's own AdamW state (or zero), padding rows zero — plus the scheduler, RNG
and trainer-state files copied as they are, so `Trainer.train(resume_from_checkpoint=out_dir)`
continues the user's run on the extended model.

Trainer saves `optimizer.state_dict()`, which knows parameters only by position. The positions
are rebuilt the way Trainer builds its two parameter groups (weight decay / no weight decay, in
`named_parameters()` order) and every saved moment is checked against its parameter's shape, so
a run with a custom optimizer layout is refused instead of silently scrambled.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from .errors import InvalidOptionError

OPTIMIZER_NAME = "optimizer.pt"
TRAINER_STATE_NAME = "trainer_state.json"
# Files Trainer reads when resuming, besides the model and the optimizer: copied unchanged.
CARRIED_FILES = ("scheduler.pt", "trainer_state.json", "training_args.bin", "scaler.pt")
CARRIED_GLOBS = ("rng_state*.pth",)
MOMENTS = ("exp_avg", "exp_avg_sq")


def is_trainer_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return (path / OPTIMIZER_NAME).is_file() and (path / TRAINER_STATE_NAME).is_file()


def trainer_parameter_order(model) -> list[list[str]]:
    """Parameter names per optimizer group, as `Trainer.create_optimizer` lays them out."""
    from transformers import Trainer

    # get_decay_parameter_names does not use the Trainer instance; calling it keeps us in step
    # with whatever the installed transformers considers "no decay" (biases, norms).
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [[n for n, _ in named if n in decay], [n for n, _ in named if n not in decay]]


def adapter_moments(adapter_optimizer_state: dict | None) -> dict[str, dict]:
    """The adapter AdamW state (TrainResult.optimizer_state) keyed input_rows / output_rows /
    output_bias."""
    if not adapter_optimizer_state:
        return {}
    found: dict[str, dict] = {}
    names = {"input_rows": ["input_rows"], "output_rows": ["output_rows", "output_bias"]}
    for group in adapter_optimizer_state["param_groups"]:
        for key, index in zip(names.get(group.get("name"), []), group["params"]):
            if index in adapter_optimizer_state["state"]:
                found[key] = adapter_optimizer_state["state"][index]
    return found


def extend_optimizer_state(
    optimizer_state: dict,
    model,
    *,
    base_vocab_size: int,
    num_new: int,
    adapter_optimizer_state: dict | None = None,
) -> tuple[dict, dict]:
    """Resize the vocab-sized moments of a Trainer AdamW state for the extended `model`.

    `model` is the extended (merged, resized) model; its parameter names are the base model's.
    Returns (new state dict, report).
    """
    groups = trainer_parameter_order(model)
    saved_groups = optimizer_state["param_groups"]
    if [len(g) for g in groups] != [len(g["params"]) for g in saved_groups]:
        raise InvalidOptionError(
            "the base checkpoint's optimizer.pt does not have the layout Trainer gives this model "
            f"({[len(g['params']) for g in saved_groups]} parameters per group, expected "
            f"{[len(g) for g in groups]}); only optimizer states saved by transformers.Trainer with its "
            "default parameter groups can be carried over — publish without it or retrain",
            param="base_model",
        )
    params = dict(model.named_parameters())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    vocab_params = {id(embedding): "input_rows"}
    if head is not None and head.weight is not embedding:
        vocab_params[id(head.weight)] = "output_rows"
        if getattr(head, "bias", None) is not None:
            vocab_params[id(head.bias)] = "output_bias"
    adapter = adapter_moments(adapter_optimizer_state)
    new_state: dict = {}
    report = {"resized": [], "new_rows_from": "adapter" if adapter else "zero"}
    for group_names, saved in zip(groups, saved_groups):
        for name, index in zip(group_names, saved["params"]):
            entry = optimizer_state["state"].get(index)
            if entry is None:  # a parameter that never got a gradient has no state yet
                continue
            param = params[name]
            role = vocab_params.get(id(param))
            if role is None:
                _check_shape(entry, name, tuple(param.shape))
                new_state[index] = entry
                continue
            new_state[index] = _resize_entry(entry, name, param, base_vocab_size, num_new, adapter.get(role))
            report["resized"].append(name)
    if not report["resized"]:
        raise InvalidOptionError(
            "the base checkpoint's optimizer.pt has no state for the embedding; nothing to carry over",
            param="base_model",
        )
    return {"state": new_state, "param_groups": optimizer_state["param_groups"]}, report


def _check_shape(entry: dict, name: str, shape: tuple) -> None:
    for key in MOMENTS:
        if key not in entry:
            raise InvalidOptionError(
                f"the base checkpoint's optimizer state has no {key!r} for {name}; only AdamW/Adam "
                "states can be carried over",
                param="base_model",
            )
        if tuple(entry[key].shape) != shape:
            raise InvalidOptionError(
                f"the base checkpoint's optimizer state for {name} has shape {tuple(entry[key].shape)}, "
                f"the parameter {shape}: the optimizer.pt does not belong to this model",
                param="base_model",
            )


def _resize_entry(entry: dict, name: str, param, base_vocab_size: int, num_new: int, adapter: dict | None) -> dict:
    old_rows = entry["exp_avg"].shape[0] if "exp_avg" in entry else 0
    _check_shape(entry, name, (old_rows,) + tuple(param.shape[1:]))  # only the row count may differ
    if old_rows < base_vocab_size:
        raise InvalidOptionError(
            f"the base checkpoint's optimizer state for {name} has {old_rows} rows, fewer than the "
            f"{base_vocab_size} tokens of the base tokenizer",
            param="base_model",
        )
    resized = dict(entry)
    end = base_vocab_size + num_new
    for key in MOMENTS:
        old = entry[key]
        grown = torch.zeros((param.shape[0],) + tuple(old.shape[1:]), dtype=old.dtype)
        grown[:base_vocab_size] = old[:base_vocab_size]
        if adapter is not None and key in adapter:
            grown[base_vocab_size:end] = adapter[key].to(old.dtype)
        resized[key] = grown
    return resized


def carry_trainer_state(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    model,
    *,
    base_vocab_size: int,
    num_new: int,
    adapter_optimizer_state: dict | None = None,
) -> dict:
    """Write the extended optimizer.pt and copy the other resume files into `out_dir`."""
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    state = torch.load(checkpoint_dir / OPTIMIZER_NAME, map_location="cpu", weights_only=True)
    extended, report = extend_optimizer_state(
        state, model, base_vocab_size=base_vocab_size, num_new=num_new,
        adapter_optimizer_state=adapter_optimizer_state,
    )
    torch.save(extended, out_dir / OPTIMIZER_NAME)
    copied = [OPTIMIZER_NAME]
    for name in CARRIED_FILES:
        if (checkpoint_dir / name).is_file():
            shutil.copy2(checkpoint_dir / name, out_dir / name)
            copied.append(name)
    for pattern in CARRIED_GLOBS:
        for path in sorted(checkpoint_dir.glob(pattern)):
            shutil.copy2(path, out_dir / path.name)
            copied.append(path.name)
    report["files"] = copied
    report["global_step"] = json.loads((checkpoint_dir / TRAINER_STATE_NAME).read_text()).get("global_step")
    return report
