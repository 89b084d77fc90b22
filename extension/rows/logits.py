"""What a model does to its head's output before it calls it logits, reproduced and checked.

Most causal LMs return `lm_head(hidden)`. Some transform it: Granite divides by
`config.logits_scaling`, Cohere multiplies by `logit_scale`, Gemma 2/3 soft-cap with
`final_logit_softcapping` (cap * tanh(z / cap)); Mamba casts its fp32 hidden states to the head's
dtype first. Training and scoring compute logits from the hidden states themselves (never the
full [batch, seq, vocab] logits at once), so they must apply the same transform, and the rows
are trained against what the model will really predict.

`LogitTransform.from_model` reads the transform from the model (scale, then cap, in the order
the families' forwards apply them); `head_mismatch` checks it on a probe batch against the
model's own forward, and a model whose logits it cannot reproduce is refused with the reason
(`check_head`) rather than trained against the wrong logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError

from ..errors import UnsupportedModelError

# (where the value lives, attribute name, how it turns into a multiplier)
_SCALES = (("config", "logits_scaling", lambda v: 1.0 / float(v)),  # Granite: logits / logits_scaling
           ("module", "logit_scale", float),  # Cohere: logits * self.logit_scale (copied from its config)
           ("config", "logit_scale", float))
_NEUTRAL = {"logits_scaling": 1.0, "logit_scale": 1.0, "final_logit_softcapping": None}


def _configs(model) -> list:
    """The model's config and its text config (multimodal classes keep text settings there)."""
    config = model.config
    configs = [config]
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    if text is not None and text is not config:
        configs.append(text)
    return configs


@dataclass(frozen=True)
class LogitTransform:
    """logits = cap * tanh(scale * z / cap) (no cap: scale * z), z = head(hidden) in fp32."""

    scale: float = 1.0
    softcap: float | None = None

    @classmethod
    def from_model(cls, model) -> "LogitTransform":
        scale = 1.0
        seen: set[str] = set()
        for where, name, multiplier in _SCALES:
            holders = [model] if where == "module" else _configs(model)
            for holder in holders:
                value = holder.__dict__.get(name) if where == "module" else getattr(holder, name, None)
                if isinstance(value, (int, float)) and name not in seen:
                    scale *= multiplier(value)
                    seen.add(name)
        cap = next((getattr(c, "final_logit_softcapping", None) for c in _configs(model)
                    if getattr(c, "final_logit_softcapping", None)), None)
        return cls(scale=scale, softcap=float(cap) if cap else None)

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and not self.softcap

    def describe(self) -> str:
        parts = ([f"x {self.scale:g}"] if self.scale != 1.0 else []) + ([f"softcap {self.softcap:g}"] if self.softcap else [])
        return ", ".join(parts) or "none"

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """The transformed logits (a new tensor; differentiable)."""
        if self.scale != 1.0:
            z = z * self.scale
        return torch.tanh(z / self.softcap) * self.softcap if self.softcap else z

    def apply_(self, z: torch.Tensor) -> torch.Tensor:
        """Transform `z` in place; returns it."""
        if self.scale != 1.0:
            z.mul_(self.scale)
        if self.softcap:
            z.div_(self.softcap).tanh_().mul_(self.softcap)
        return z

    def slope_(self, logits: torch.Tensor) -> torch.Tensor | float:
        """d logits / d z, given the transformed `logits` (overwritten where a cap needs a tensor)."""
        if not self.softcap:
            return self.scale
        return logits.div_(self.softcap).square_().neg_().add_(1).mul_(self.scale)

    # -- while rows are attached, the adapter's head applies the transform itself ---------------
    def disable_in(self, model) -> list[tuple[object, str, object]]:
        """Turn the model's own transform off (its head now returns finished logits, -inf padding
        included, which a cap would turn into -cap). Returns what to restore."""
        saved = []
        for holder in [model, *_configs(model)]:
            for name, neutral in _NEUTRAL.items():
                present = name in holder.__dict__ if holder is model else getattr(holder, name, None) is not None
                if present and getattr(holder, name) != neutral:
                    saved.append((holder, name, getattr(holder, name)))
                    _set(holder, name, neutral)
        return saved

    @staticmethod
    def restore(saved: list[tuple[object, str, object]]) -> None:
        for holder, name, value in reversed(saved):
            _set(holder, name, value)


def _set(holder, name: str, value) -> None:
    try:
        setattr(holder, name, value)
    except (ValueError, TypeError, StrictDataclassError):
        # a config that validates its fields (Gemma 3n's wants a float softcap, never None): skip
        # the validation, as loading a checkpoint does
        holder.__dict__[name] = value


def text_decoder(model) -> torch.nn.Module:
    """The module that turns text ids into the hidden states the head reads: a multimodal model's
    own text decoder (its `language_model`), else the base model. Training and scoring text holds
    no image or audio token, so the wrapper adds nothing there, and it may route ids by value:
    Gemma 3n's sends every id from 262,144 up to its vision and audio embedders, new rows' ids
    (appended while the adapter trains) among them."""
    base = model.base_model
    language_model = getattr(base, "language_model", None)
    return language_model if isinstance(language_model, torch.nn.Module) else base


def head_logits(model, hidden: torch.Tensor, head: torch.nn.Module | None = None,
                transform: LogitTransform | None = None) -> torch.Tensor:
    """fp32 logits of `hidden` through the plain head, the hidden states cast to the head's dtype
    first (Mamba's forward does so: its hidden states stay fp32 under a bf16 head)."""
    head = head if head is not None else model.get_output_embeddings()
    weight = head.weight
    logits = F.linear(hidden.to(weight.device, weight.dtype), weight, getattr(head, "bias", None)).float()
    transform = transform if transform is not None else LogitTransform.from_model(model)
    return transform.apply_(logits)


def probe_ids(vocab: int, device, length: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (2, length), generator=g).to(device)


def head_mismatch(model, base_vocab_size: int, transform: LogitTransform | None = None) -> str | None:
    """None when decoder + head + `transform` reproduce the model's own logits on a probe batch;
    else why not (in words a user can read)."""
    transform = transform if transform is not None else LogitTransform.from_model(model)
    head = model.get_output_embeddings()
    if head is None or getattr(head, "weight", None) is None:
        return f"{type(model).__name__} has no output embedding (lm_head) whose rows could be extended"
    ids = probe_ids(base_vocab_size, head.weight.device)
    with torch.no_grad():
        try:
            hidden = text_decoder(model)(input_ids=ids, use_cache=False).last_hidden_state
        except (AttributeError, TypeError) as exc:
            return f"{type(model).__name__}'s base model gives no last_hidden_state to put through the head ({exc})"
        reference = model(input_ids=ids, use_cache=False).logits.float()
        mine = head_logits(model, hidden, head, transform)
    if mine.shape != reference.shape:
        return (f"{type(model).__name__}'s logits have shape {tuple(reference.shape)}, its head gives "
                f"{tuple(mine.shape)}")
    tolerance = 1e-3 if reference.dtype == torch.float32 and head.weight.dtype == torch.float32 else 5e-2
    difference = float((mine.log_softmax(-1) - reference.log_softmax(-1)).abs().max())
    if difference > tolerance:
        return (f"{type(model).__name__}'s forward does more to its head's output than TIDE reproduces "
                f"(logit transform read from its config: {transform.describe()}); on a probe batch its "
                f"log-probabilities differ by up to {difference:.3g}")
    return None


def check_head(model, base_vocab_size: int) -> LogitTransform:
    """The model's logit transform, checked on a probe batch; refuses a head it cannot reproduce."""
    transform = LogitTransform.from_model(model)
    reason = head_mismatch(model, base_vocab_size, transform)
    if reason is not None:
        raise UnsupportedModelError(
            f"cannot train new rows for this model: {reason}. New rows would be trained against logits "
            "the model never produces; extend it with --steps 0 (rows from their pieces, no training) or "
            "use a model whose logits are its head's output (scaled or soft-capped as its config says)")
    return transform
