"""Carry a training run's AdamW state over to the extended model, old rows' moments untouched.

Because TIDE trains the new rows in their own parameters, the run's optimizer state for every old
parameter stays valid. Growing it means: the vocab-sized moments (embedding, and for untied models
lm_head weight and bias) get rows for the new tokens — the old rows' `exp_avg` / `exp_avg_sq`
bit-identical, the new rows' moments from TIDE's own AdamW over those rows (rescaled, see
`grow_moments`), padding rows zero — and every other parameter's state is kept as it is.

Two doors share that one mechanism:
- a saved `transformers.Trainer` checkpoint (`TrainerCheckpoint`: the pipeline publishes the
  extended folder as a resumable checkpoint: optimizer.pt grown, scheduler / trainer state / RNG
  files carried);
- a live run (`grow_live_optimizer`, used by extension.live): the optimizer object itself, its
  parameters swapped for the resized ones.

Trainer saves `optimizer.state_dict()`, which knows parameters only by position. The positions
are rebuilt the way Trainer builds its two default groups (weight decay / no weight decay, in
`named_parameters()` order) and every saved moment is checked against its parameter's shape, so a
checkpoint with another layout is refused naming the parameter at fault, never scrambled.
Optimizers without Adam moments (Adafactor, 8-bit, SGD) and sharded states (DeepSpeed ZeRO,
FSDP) are refused with the reason.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UnsupportedCheckpointError

OPTIMIZER_NAME = "optimizer.pt"
TRAINER_STATE_NAME = "trainer_state.json"
# Files Trainer reads when resuming, besides the model and the optimizer: copied unchanged.
CARRIED_FILES = ("scheduler.pt", "trainer_state.json", "training_args.bin", "scaler.pt")
CARRIED_GLOBS = ("rng_state*.pth",)
MOMENTS = ("exp_avg", "exp_avg_sq")
# Signs of an optimizer state saved in shards instead of one optimizer.pt.
_SHARDED = {
    "DeepSpeed ZeRO": ("zero_to_fp32.py", "latest", "global_step*/*optim_states.pt"),
    "FSDP": ("optimizer_0", "pytorch_model_fsdp_0", "*.distcp", "optimizer.bin"),
}


# -- the one mechanism: grow a vocab-sized AdamW entry --------------------------------------------
def grow_moments(entry: dict, rows: int, base_vocab_size: int, new: dict | None, run_betas,
                 at_ids: list[int] | None = None) -> dict:
    """The AdamW state `entry` of a vocab-sized tensor, grown to `rows` rows.

    Rows below base_vocab_size keep their moments bit-identical; the new rows get `new`'s moments
    (`adapter_moments`: TIDE's own AdamW state of those rows) or zero; the rest (padding) zero.
    With `at_ids` (new tokens on reserved ids) nothing grows: the rows at those ids get the new
    rows' moments (or zero: the reserved token's moments belonged to another token), every other
    row keeps its own.

    Why the rescale: AdamW reads a moment through its tensor's bias correction, m / (1 - beta1^t),
    with t the tensor's own step count. The run's tensor is at step t_run while TIDE's rows were
    trained for t_rows steps with their own betas. Storing m_rows * (1 - b1_run^t_run) /
    (1 - b1_rows^t_rows) makes the run read m_stored / (1 - b1_run^t_run) = m_rows / (1 - b1_rows^t_rows):
    exactly the corrected moment TIDE ended with. The same holds for exp_avg_sq with beta2.
    """
    _check_adam(entry)
    resized = dict(entry)
    scale = {}
    if new is not None:
        t_run, t_rows = float(entry["step"]), float(new["step"])
        (b1_run, b2_run), (b1_rows, b2_rows) = run_betas, new["betas"]
        scale["exp_avg"] = (1 - b1_run**t_run) / (1 - b1_rows**t_rows)
        scale["exp_avg_sq"] = scale["max_exp_avg_sq"] = (1 - b2_run**t_run) / (1 - b2_rows**t_rows)
    for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        if key not in entry:
            continue
        old = entry[key]
        if at_ids is not None:
            grown = old.clone()
            index = torch.tensor(at_ids, dtype=torch.long, device=old.device)
            grown[index] = 0
            if new is not None:
                source = new["exp_avg" if key == "exp_avg" else "exp_avg_sq"].double() * scale[key]
                grown[index] = source.to(old.device, old.dtype)
            resized[key] = grown
            continue
        grown = old.new_zeros((rows,) + tuple(old.shape[1:]))
        grown[:base_vocab_size] = old[:base_vocab_size]
        if new is not None:
            source = new["exp_avg" if key == "exp_avg" else "exp_avg_sq"].double() * scale[key]
            grown[base_vocab_size:base_vocab_size + source.shape[0]] = source.to(old.device, old.dtype)
        resized[key] = grown
    return resized


def adapter_moments(adapter_optimizer_state: dict | None) -> dict[str, dict]:
    """TIDE's AdamW state of the new rows (train.TrainResult.optimizer_state), keyed by role:
    input_rows / output_rows / output_bias -> {exp_avg, exp_avg_sq, step, betas}."""
    if not adapter_optimizer_state:
        return {}
    found: dict[str, dict] = {}
    names = {"input_rows": ["input_rows"], "output_rows": ["output_rows", "output_bias"]}
    for group in adapter_optimizer_state["param_groups"]:
        for role, index in zip(names.get(group.get("name"), []), group["params"]):
            if index in adapter_optimizer_state["state"]:
                found[role] = {**adapter_optimizer_state["state"][index], "betas": tuple(group["betas"])}
    return found


def vocab_parameters(model) -> dict[int, str]:
    """id(parameter) -> role for the model's vocab-sized parameters (tied: the embedding only)."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    roles = {id(embedding): "input_rows"}
    if head is not None and head.weight is not embedding:
        roles[id(head.weight)] = "output_rows"
        if getattr(head, "bias", None) is not None:
            roles[id(head.bias)] = "output_bias"
    return roles


def _check_adam(entry: dict, name: str = "a parameter") -> None:
    missing = [key for key in MOMENTS + ("step",) if key not in entry]
    if missing:
        raise UnsupportedCheckpointError(
            f"the optimizer state of {name} has no {', '.join(missing)} (it holds {', '.join(sorted(entry)) or 'nothing'}): "
            "only Adam/AdamW states can be carried over; other optimizers (Adafactor, 8-bit Adam, SGD) "
            "are refused rather than given made-up moments"
        )


# -- a live optimizer (extension.live) -------------------------------------------------------------
def grow_live_optimizer(optimizer, replaced: list[tuple[torch.nn.Parameter, torch.nn.Parameter, str]], *,
                        base_vocab_size: int, adapter_optimizer_state: dict | None) -> dict:
    """Swap each (old, new, role) parameter in `optimizer` and grow its state in place.

    `optimizer` may be accelerate's wrapper (Trainer's); the torch optimizer inside is changed.
    A parameter the optimizer does not train (a frozen embedding) is left alone."""
    optimizer = getattr(optimizer, "optimizer", optimizer)
    moments = adapter_moments(adapter_optimizer_state)
    report = {"resized": [], "new_rows_from": "adapter" if moments else "zero", "not_in_optimizer": []}
    for old, new, role in replaced:
        slot = next(((group, i) for group in optimizer.param_groups for i, p in enumerate(group["params"]) if p is old), None)
        if slot is None:
            report["not_in_optimizer"].append(role)
            continue
        group, index = slot
        group["params"][index] = new
        entry = optimizer.state.pop(old, None)
        if entry:
            _check_adam(entry, role)
            optimizer.state[new] = grow_moments(entry, new.shape[0], base_vocab_size, moments.get(role), group["betas"])
        report["resized"].append(role)
    return report


# -- a saved Trainer checkpoint ---------------------------------------------------------------------
def trainer_parameter_order(model) -> list[list[str]]:
    """Parameter names per optimizer group, as `Trainer.create_optimizer` lays them out."""
    from transformers import Trainer

    # get_decay_parameter_names does not use the Trainer instance; calling it keeps us in step
    # with whatever the installed transformers considers "no decay" (biases, norms).
    # Every parameter counts as trainable: the pipeline loads the base frozen, while the run that
    # saved the checkpoint trained all of them (a run that froze some has another layout: refused).
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [name for name, _ in model.named_parameters()]
    return [[n for n in named if n in decay], [n for n in named if n not in decay]]


def refuse_sharded_state(folder: Path) -> None:
    for kind, patterns in _SHARDED.items():
        for pattern in patterns:
            found = sorted(folder.glob(pattern))
            if found:
                raise UnsupportedCheckpointError(
                    f"the base model folder holds a {kind} optimizer state ({found[0].name}), saved in shards "
                    "rather than one optimizer.pt; TIDE cannot carry it over and will not publish the "
                    f"checkpoint without its state. Consolidate it first (DeepSpeed: zero_to_fp32.py for the "
                    "weights; FSDP: save with a full state dict), or point base_model at the model weights alone"
                )


@dataclass
class TrainerCheckpoint:
    """A Trainer checkpoint given as the base model: its folder, optimizer.pt and step."""

    folder: Path
    optimizer_state: dict
    global_step: int | None

    def extend(self, model, *, base_vocab_size: int, adapter_optimizer_state: dict | None,
               at_ids: list[int] | None = None) -> tuple[dict, dict]:
        """optimizer.pt for the extended (merged, resized) `model`, and a report of what was done
        (`at_ids`: the new rows sit on those reserved ids, grow_moments)."""
        names = trainer_parameter_order(model)
        params = dict(model.named_parameters())
        roles = vocab_parameters(model)
        moments = adapter_moments(adapter_optimizer_state)
        saved = self.optimizer_state
        state: dict = {}
        report = {"from_step": self.global_step, "resized": [], "new_rows_from": "adapter" if moments else "zero"}
        for group_names, group in zip(names, saved["param_groups"]):
            for name, index in zip(group_names, group["params"]):
                entry = saved["state"].get(index)
                if entry is None:  # a parameter that never got a gradient has no state yet
                    continue
                role = roles.get(id(params[name]))
                if role is None:
                    state[index] = entry
                    continue
                state[index] = grow_moments(entry, params[name].shape[0], base_vocab_size, moments.get(role), group["betas"],
                                            at_ids=at_ids)
                report["resized"].append(name)
        return {"state": state, "param_groups": saved["param_groups"]}, report

    def carried_files(self) -> list[Path]:
        """The files besides the model and optimizer.pt that Trainer resumes from."""
        found = [self.folder / name for name in CARRIED_FILES if (self.folder / name).is_file()]
        return found + [path for pattern in CARRIED_GLOBS for path in sorted(self.folder.glob(pattern))]

    def write_list(self) -> list[str]:
        return [OPTIMIZER_NAME] + [path.name for path in self.carried_files()]

    def write(self, out_dir: Path, optimizer_state: dict) -> None:
        """Write optimizer.pt and copy the other files Trainer resumes from into `out_dir`."""
        torch.save(optimizer_state, Path(out_dir) / OPTIMIZER_NAME)
        for source in self.carried_files():
            shutil.copy2(source, Path(out_dir) / source.name)


def trainer_checkpoint(folder: str | Path, model) -> TrainerCheckpoint | None:
    """The Trainer checkpoint in `folder`, checked against `model` (the base model it holds), or
    None when the folder holds a model only. Raises UnsupportedCheckpointError for optimizer
    states that cannot be carried (sharded, not Adam, another parameter layout)."""
    folder = Path(folder)
    refuse_sharded_state(folder)
    if not (folder / OPTIMIZER_NAME).is_file():
        return None
    state = torch.load(folder / OPTIMIZER_NAME, map_location="cpu", weights_only=True)
    _check_layout(state, model)
    step = None
    if (folder / TRAINER_STATE_NAME).is_file():
        step = json.loads((folder / TRAINER_STATE_NAME).read_text()).get("global_step")
    return TrainerCheckpoint(folder=folder, optimizer_state=state, global_step=step)


def _check_layout(state: dict, model) -> None:
    """Every saved moment must sit where Trainer's default layout puts a parameter of its shape,
    in the same group; the first one that does not is named."""
    names = trainer_parameter_order(model)
    groups = ("weight decay", "no weight decay")
    params = dict(model.named_parameters())
    layout_hint = (
        "only optimizer states saved by transformers.Trainer with its default parameter groups (weight "
        "decay / no weight decay) can be carried over; to extend a run with a custom layout, use the live "
        "callback (extension.live), which sees the optimizer itself"
    )
    expected = [(g, name) for g, group in enumerate(names) for name in group]
    saved = [(g, index) for g, group in enumerate(state.get("param_groups", [])) for index in group["params"]]
    for (group, name), (saved_group, index) in zip(expected, saved):
        entry = state["state"].get(index)
        if entry is not None:
            _check_adam(entry, name)
        shape = tuple(entry["exp_avg"].shape) if entry is not None else None
        if saved_group != group or (shape is not None and shape != tuple(params[name].shape)):
            found = f"moments of shape {shape}" if shape is not None else "a parameter without state"
            raise UnsupportedCheckpointError(
                f"the base checkpoint's optimizer.pt does not match Trainer's layout at {name}: Trainer puts "
                f"{name} (shape {tuple(params[name].shape)}) in the {groups[group] if group < 2 else group} group, "
                f"the optimizer.pt has {found} there, in group {saved_group}; {layout_hint}"
            )
    if len(expected) != len(saved):
        raise UnsupportedCheckpointError(
            f"the base checkpoint's optimizer.pt holds {len(saved)} parameters, Trainer's layout for this model "
            f"{len(expected)}; {layout_hint}"
        )
