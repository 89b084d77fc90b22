"""Before loading: how much memory the job will need, and refusing a job that cannot fit.

An out-of-memory crash halfway through training costs the minutes before it and says nothing
useful; this estimate is made from the model's config before a byte of weights is read, and a job
that cannot fit is refused with the figures and what to change.

What is counted (bytes, on the job's device):

- weights: the parameter count (the architecture built from the config on the meta device, no
  weights read; else the checkpoint's safetensors headers) x the bytes of the load dtype;
- training activations: batch_size x seq_len x layers x hidden x ACTIVATION_FACTOR x the bytes of
  the compute dtype. The frozen base still keeps, for the backward to the new input rows, what
  each decoder layer saved: for a Llama-style layer the two norm inputs and outputs, q, k, v,
  the attention output and residuals (about 8 hidden-sized values per token) and the gated MLP's
  gate, up, activation and product (4 intermediate-sized values). ACTIVATION_FACTOR is therefore
  8 + 4 x intermediate/hidden (18.7 for SmolLM2, 20.8 for Gemma 3 270M). Attention is assumed
  to be SDPA / flash (no seq_len^2 score matrix is kept);
- the loss: TIDE's chunked loss never builds [batch, seq, vocab] logits; it holds one chunk of
  LOSS_CHUNK_ELEMENTS fp32 logits (x3: old and new logits, their softmax in place, the softcap
  slope) plus the gradient of the hidden states (batch x seq x hidden, fp32, twice);
- the new rows and their AdamW state: rows x hidden x 4 bytes x 4 (value, gradient, two
  moments), twice for untied models;
- evaluation (not at the same time as training): its batch's transient activations and two
  slices of fp32 logits;
- resizing the vocabulary at the end: the new embedding (and head, when untied) while the old one
  still exists; on the CPU, when the job computes in another dtype than the checkpoint's (bf16 on
  an AMX CPU), publishing loads the checkpoint's own weights beside the computing copy and
  resizes those instead;
- CUDA only: CUDA_CONTEXT_BYTES for the context, cuBLAS workspaces and allocator slack.

The total is compared with what the device has free (torch.cuda.mem_get_info; on the CPU
MemAvailable, capped by the container's cgroup limit). It is an estimate with a stated factor,
not a measurement: benchmarks/gpu_job.py prints it next to the measured peak.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from .devices import Placement, available_host_memory, free_device_memory
from ..errors import InvalidOptionError

GIB = 1024**3
LOSS_CHUNK_ELEMENTS = 32 * 2**20  # rows.DEFAULT_LOSS_CHUNK_ELEMENTS
EVAL_LOGIT_ELEMENTS = 1 << 24  # evaluate.DEFAULT_LOGIT_ELEMENTS
CUDA_CONTEXT_BYTES = 1 * GIB
ROWS_PER_TERM = 8  # an upper bound on new vocabulary entries per given term (forms + intermediates)


class InsufficientMemoryError(InvalidOptionError):
    """The job cannot fit on its device. Raised with `option` (batch_size) when a smaller batch
    would fit, or with a plain message naming the base model when its weights alone do not."""

    code = "insufficient_memory"


@dataclass
class MemoryPlan:
    device: str
    dtype: str
    parts: dict[str, int]  # bytes
    needed: int
    available: int
    per_sequence: int = 0  # training bytes one more sequence of seq_len tokens costs
    batch_independent: int = 0  # training bytes whatever the batch size (weights, loss chunk, rows)
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.needed <= self.available

    def to_json(self) -> dict:
        data = asdict(self)
        data["parts_gib"] = {k: round(v / GIB, 3) for k, v in self.parts.items()}
        data["needed_gib"] = round(self.needed / GIB, 3)
        data["available_gib"] = round(self.available / GIB, 3)
        return data


def _text_config(config):
    return getattr(config, "text_config", None) or config


def count_parameters(config) -> int:
    """Parameters of the model `config` describes (tied matrices once), built on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def estimate_parameters(config, model_path=None) -> int:
    """count_parameters when the architecture can be built from its config; else the tensors the
    checkpoint's safetensors files hold; else a Llama-shaped formula from the config's sizes."""
    try:
        return count_parameters(config)
    except Exception:  # an architecture transformers cannot build here (remote code, a newer class)
        pass
    from pathlib import Path

    from .devices import safetensors_header

    files = sorted(Path(model_path).glob("*.safetensors")) if model_path and Path(model_path).is_dir() else []
    if files:
        total = 0
        for file in files:
            for name, entry in safetensors_header(file).items():
                if name != "__metadata__":
                    count = 1
                    for size in entry["shape"]:
                        count *= size
                    total += count
        return total
    text = _text_config(config)
    hidden, layers = int(text.hidden_size), int(text.num_hidden_layers)
    inner = _intermediate_size(text, hidden)
    return layers * (4 * hidden * hidden + 3 * hidden * inner) + 2 * int(text.vocab_size) * hidden


def _intermediate_size(text, hidden: int) -> int:
    """The MLP width; Gemma 3n keeps one per layer, and the widest layer bounds the activations."""
    inner = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * hidden
    return int(max(inner)) if isinstance(inner, (list, tuple)) else int(inner)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def plan_job(config, *, placement: Placement, dtype: torch.dtype, batch_size: int, seq_len: int, steps: int,
             new_rows: int, parameters: int | None = None, available: int | None = None,
             eval_batch_tokens: int = 4096, stored_dtype: torch.dtype | None = None) -> MemoryPlan:
    """The memory plan of a job on `placement` (see the module docstring). `available` overrides
    what the device reports (tests, and callers that reserve part of it)."""
    text = _text_config(config)
    hidden = int(getattr(text, "hidden_size", None) or getattr(text, "n_embd"))
    layers = int(getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer"))
    inner = _intermediate_size(text, hidden)
    vocab = int(getattr(text, "vocab_size"))
    tied = bool(getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", True)))
    element = _element_size(dtype)
    parameters = count_parameters(config) if parameters is None else parameters
    factor = 8 + 4 * inner / hidden

    parts: dict[str, int] = {}
    notes = [f"activation factor {factor:.1f} hidden-sized values per token and layer (8 + 4 x intermediate/hidden)"]
    parts["weights"] = parameters * element
    if isinstance(placement.device_map, dict) and "disk" in placement.device_map.values():
        parts["weights"] = 0
        notes.append("weights offloaded to disk by the device map are not counted")
    training = 0
    per_sequence = 0
    batch_independent = 0
    if steps > 0:
        per_sequence = int(seq_len * layers * hidden * factor * element + 2 * seq_len * hidden * 4)
        loss_chunk = 3 * min(LOSS_CHUNK_ELEMENTS, batch_size * seq_len * (vocab + new_rows)) * 4
        rows = new_rows * hidden * 4 * 4 * (1 if tied else 2)
        parts["training_activations"] = int(batch_size * seq_len * layers * hidden * factor * element)
        parts["training_loss"] = loss_chunk + 2 * batch_size * seq_len * hidden * 4
        parts["new_rows_and_adamw"] = rows
        training = parts["training_activations"] + parts["training_loss"] + rows
        batch_independent = loss_chunk + rows
    evaluation = int(eval_batch_tokens * (6 * hidden + 3 * inner) * element + 2 * min(EVAL_LOGIT_ELEMENTS, eval_batch_tokens * vocab) * 4)
    parts["evaluation"] = evaluation
    resize = (vocab + new_rows + 64) * hidden * element * (1 if tied else 2)
    if placement.device.type == "cpu" and stored_dtype is not None and stored_dtype != dtype:
        stored = _element_size(stored_dtype)  # publishing.stage._publishable: the checkpoint's copy, resized
        resize = parameters * stored + (vocab + new_rows + 64) * hidden * stored * (1 if tied else 2)
        notes.append(f"publishing loads the checkpoint's {str(stored_dtype).removeprefix('torch.')} weights beside "
                     f"the {str(dtype).removeprefix('torch.')} ones the job computes in")
    parts["vocabulary_resize"] = resize
    workspace = CUDA_CONTEXT_BYTES if placement.device.type == "cuda" else 0
    if workspace:
        parts["cuda_context"] = workspace
    needed = parts["weights"] + max(training, evaluation, resize) + workspace
    if batch_independent:
        batch_independent += parts["weights"] + workspace
    if available is None:
        available = available_memory(placement)
    return MemoryPlan(device=placement.label, dtype=str(dtype).removeprefix("torch."), parts=parts, needed=int(needed),
                      available=int(available), per_sequence=per_sequence,
                      batch_independent=batch_independent, notes=notes)


def plan_for_spec(spec, config, *, placement: Placement, dtype: torch.dtype, eval_batch_tokens: int = 4096,
                  available: int | None = None, model_path=None, stored_dtype: torch.dtype | None = None) -> MemoryPlan:
    """plan_job for a job's options. New rows are bounded before the tokenizer is extended: a
    given term makes at most ROWS_PER_TERM entries, a mined corpus at most max_new_tokens."""
    new_rows = len(spec.terms) * ROWS_PER_TERM if spec.terms else spec.max_new_tokens
    return plan_job(config, placement=placement, dtype=dtype, batch_size=spec.batch_size, seq_len=spec.seq_len,
                    steps=spec.steps, new_rows=new_rows, eval_batch_tokens=eval_batch_tokens, available=available,
                    parameters=estimate_parameters(config, model_path), stored_dtype=stored_dtype)


def available_memory(placement: Placement) -> int:
    """Free memory of the job's device; with a device map, of every GPU it may use plus the
    host's memory (accelerate puts what does not fit on the GPUs in CPU memory)."""
    if placement.device_map is None:
        return free_device_memory(placement.device)
    total = available_host_memory()
    if torch.cuda.is_available() and placement.device.type == "cuda":
        total += sum(int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count()))
    return total


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def check_plan(plan: MemoryPlan, *, base_model: str, batch_size: int, seq_len: int) -> None:
    """Raise InsufficientMemoryError when the plan does not fit, naming what to change."""
    if plan.fits:
        return
    fixed = plan.parts["weights"] + plan.parts.get("cuda_context", 0)
    breakdown = ", ".join(f"{name.replace('_', ' ')} {_gib(value)}" for name, value in plan.parts.items() if value)
    if fixed + max(plan.parts["evaluation"], plan.parts["vocabulary_resize"]) > plan.available or not plan.per_sequence:
        raise InsufficientMemoryError(
            f"base model {base_model!r} needs about {_gib(plan.needed)} on {plan.device} in {plan.dtype} ({breakdown}), "
            f"more than the {_gib(plan.available)} available there, whatever the batch size; run it where there is more "
            "memory: a GPU with more memory (the service routes big models to their own queue, docs/deploy.md), or "
            "several GPUs with device_map auto",
            param="base_model",
        )
    fits = max(0, (plan.available - plan.batch_independent) // plan.per_sequence)
    advice = (f"at most about {fits} sequence{'s' if fits != 1 else ''} of {seq_len} tokens would fit" if fits
              else f"not even one sequence of {seq_len} tokens fits: lower seq_len")
    raise InsufficientMemoryError(
        option="batch_size",
        problem=f"{batch_size} with seq_len {seq_len} needs about {_gib(plan.needed)} on {plan.device} ({breakdown}), "
        f"more than the {_gib(plan.available)} available there; lower the batch size or the sequence length "
        f"({advice}), or run the job where there is more memory",
    )
