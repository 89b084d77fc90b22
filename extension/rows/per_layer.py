"""Gemma 3n's per-layer embedding rows for new tokens (issue 40 item 1).

Gemma 3n has a second table indexed by token id, `embed_tokens_per_layer` ([vocab_size_per_layer_input,
num_layers * hidden_size_per_layer_input]), which its text model reads in `get_per_layer_inputs`
(ids past the table get row 0) and mixes into every decoder layer. A new token needs a row there
too, or it reads as row 0 (or, on a reserved id, as the reserved token it replaced):
  start    the mean of its original pieces' per-layer rows, as stored (the table's own scale; its
           forward multiplies by sqrt(hidden_size_per_layer_input), as the input embedding does by
           sqrt(hidden_size)); a piece id past the table counts as row 0, as the model reads it
  train    `install` routes new ids' per-layer inputs to a small trainable matrix through the
           table's own forward while the adapter is attached; the table itself stays frozen
  publish  `write` puts the rows at the new tokens' ids; every other row stays as it was
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn


def per_layer_owner(model) -> nn.Module | None:
    """The text model that holds the per-layer table and reads it (`get_per_layer_inputs`), or
    None for a model without one (every family but Gemma 3n, and a Gemma 3n built without it)."""
    for module in model.modules():
        table = getattr(module, "embed_tokens_per_layer", None)
        if isinstance(table, nn.Embedding) and callable(getattr(module, "get_per_layer_inputs", None)):
            return module
    return None


def per_layer_table(model) -> nn.Embedding | None:
    owner = per_layer_owner(model)
    return None if owner is None else owner.embed_tokens_per_layer


def _read_ids(table: nn.Embedding, ids: Sequence[int]) -> torch.Tensor:
    # what the model's own forward reads for these ids: row 0 past the table
    rows = table.weight.shape[0]
    return torch.tensor([i if 0 <= i < rows else 0 for i in ids], dtype=torch.long)


def mean_rows(model, new_tokens: Sequence, *, norm_corrected: bool = False) -> torch.Tensor | None:
    """[new tokens, layers * per-layer width] fp32 on the CPU: the mean of each token's original
    pieces' per-layer rows (`norm_corrected`: rescaled to the pieces' mean norm, as init
    'subword_mean_norm' does to the input rows). None for a model without a per-layer table."""
    table = per_layer_table(model)
    if table is None:
        return None
    ids: list[int] = []
    owners: list[int] = []
    for position, token in enumerate(new_tokens):
        ids.extend(token.base_ids)
        owners.extend([position] * len(token.base_ids))
    index, owner = _read_ids(table, ids), torch.tensor(owners, dtype=torch.long)
    picked = table.weight.detach()[index.to(table.weight.device)].float().cpu()
    counts = torch.bincount(owner, minlength=len(new_tokens)).clamp(min=1).float().unsqueeze(1)
    means = torch.zeros(len(new_tokens), picked.shape[1]).index_add_(0, owner, picked) / counts
    if norm_corrected:
        target = torch.zeros(len(new_tokens)).index_add_(0, owner, picked.norm(dim=1)) / counts.squeeze(1)
        means = means * (target / means.norm(dim=1).clamp(min=1e-12)).unsqueeze(1)
    return means


@torch.no_grad()
def write(model, rows: torch.Tensor, ids: Sequence[int]) -> None:
    """Write `rows` (one per id) into the per-layer table at `ids`, in its dtype. Every id must be
    inside the table: a row the model's forward never reads would be published unused."""
    table = per_layer_table(model)
    if table is None:
        raise ValueError("per-layer rows given for a model without a per-layer embedding table")
    outside = [i for i in ids if not 0 <= i < table.weight.shape[0]]
    if outside or len(ids) != rows.shape[0]:
        raise ValueError(f"{rows.shape[0]} per-layer rows for ids {list(ids)[:5]}...: ids {outside[:5]} are past "
                         f"the per-layer table's {table.weight.shape[0]:,} rows, where the model reads row 0")
    index = torch.tensor(list(ids), dtype=torch.long, device=table.weight.device)
    table.weight[index] = rows.to(table.weight.device, table.weight.dtype)


def install(model, new_rows: nn.Parameter, base_vocab_size: int) -> Callable[[], None]:
    """While training on appended ids (>= base_vocab_size, past the per-layer table, so the model
    would read row 0 for them): route their per-layer inputs to `new_rows`, through the table's
    own forward (its scale applies as to the old rows). Old ids read the frozen table as before.
    Returns the function that puts the model's own method back."""
    owner = per_layer_owner(model)
    if owner is None:
        raise ValueError("this model has no per-layer embedding table")
    table = owner.embed_tokens_per_layer
    own = owner.get_per_layer_inputs  # the bound method of the class

    def get_per_layer_inputs(input_ids: torch.Tensor) -> torch.Tensor:
        old = own(input_ids)
        is_new = input_ids >= base_vocab_size
        # padding_idx names a base id; on the small matrix it would zero a new row's gradient
        saved, table.padding_idx = table.padding_idx, None
        try:
            new = torch.func.functional_call(table, {"weight": new_rows},
                                             ((input_ids - base_vocab_size).clamp(min=0),), strict=False)
        finally:
            table.padding_idx = saved
        new = new.reshape(old.shape).to(old.dtype)
        return torch.where(is_new.reshape(*is_new.shape, *([1] * (old.dim() - is_new.dim()))), new, old)

    owner.get_per_layer_inputs = get_per_layer_inputs  # an instance attribute: the class is untouched

    def restore() -> None:
        if owner.__dict__.get("get_per_layer_inputs") is get_per_layer_inputs:
            del owner.get_per_layer_inputs

    return restore
