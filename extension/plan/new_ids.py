"""Which ids a job's new tokens get (option `new_ids`), decided from the config before any weights.

An appended id (after every id in use) is text only where the model's own forward treats it as
text. Gemma 3n does not (issue 40 item 1): `Gemma3nTextModel.get_per_layer_inputs` gives every id
from `vocab_size_per_layer_input` (262,144) up the per-layer row 0, and `Gemma3nModel` sends ids
from its vision / audio `vocab_offset` up to those embedders, so a token appended after 262,400 is
not text there; and growing the per-layer table (transformers' resize) would move that limit, giving
the old soft-token ids 262,144..262,399 random per-layer rows instead of row 0. Such a model can
only take new tokens on reserved ids below the limit (Gemma's `<unusedN>`): 'auto' picks those for
it, and an explicit 'append' is refused here, before anything is loaded or written.
"""

from __future__ import annotations

from ..errors import InvalidOptionError


def _text_config(config):
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    return text if text is not None else config


def first_non_text_id(config) -> tuple[int, str] | None:
    """(the lowest id the model's own forward does not route as text, why), where an id below its
    vocabulary size is such an id; None for a model that treats its whole vocabulary as text."""
    text = _text_config(config)
    vocab = getattr(text, "vocab_size", None)
    if not vocab:
        return None
    limits: list[tuple[int, str]] = []
    per_layer = getattr(text, "vocab_size_per_layer_input", None)
    if per_layer and getattr(text, "hidden_size_per_layer_input", None) and int(per_layer) < int(vocab):
        limits.append((int(per_layer), f"its per-layer embedding table has {int(per_layer):,} rows "
                                       f"(vocab_size_per_layer_input) for a vocabulary of {int(vocab):,}, and every "
                                       "id past the table gets the per-layer row 0"))
    for name in ("vision_config", "audio_config"):  # Gemma3nModel's soft-token embedders
        offset = getattr(getattr(config, name, None), "vocab_offset", None)
        if isinstance(offset, int) and not isinstance(offset, bool) and offset < int(vocab):
            limits.append((offset, f"its {name.split('_')[0]} embedder takes every id from {offset:,} up"))
    return min(limits) if limits else None


def appended_ids_not_text(config) -> str | None:
    """Why an appended new id would not be text on this model (None: it would be)."""
    found = first_non_text_id(config)
    if found is None:
        return None
    limit, why = found
    return f"the model routes ids from {limit:,} up away from text ({why})"


def resolve_new_ids(asked: str, config, *, base_model: str) -> tuple[str, str | None]:
    """(the ids the job uses, 'append' or 'reserved'; the reason when 'auto' chose 'reserved').
    Refuses 'append' on a model whose forward would not read appended ids as text."""
    why = appended_ids_not_text(config)
    if asked == "auto":
        if why is None:
            return "append", None
        return "reserved", f"new_ids 'auto' chose reserved ids: an appended id would not be text, since {why}"
    if asked == "append" and why is not None:
        raise InvalidOptionError(option="new_ids", problem=(
            f"is 'append', but on {base_model} {why}: a new token appended after the vocabulary would not be "
            "text in the published model. Use --new-ids reserved (API: new_ids \"reserved\"), or leave it unset ('auto' picks reserved "
            "for this model); nothing was written"))
    return asked, None
