"""Which transformers Auto class loads a base model, read from its config before any weights.

Text-only causal LMs load with `AutoModelForCausalLM`. Multimodal models whose text vocabulary
holds image tokens (Qwen2-VL / Qwen2.5-VL, LLaVA, Gemma 3 4B+) have no causal-LM class in
transformers' mapping for some of them; they load with `AutoModelForImageTextToText`, which
keeps the vision tower and the image token ids as they are (TIDE touches only the text
embedding and the head). A class neither Auto class knows is refused before loading, with the
class named (errors.UnsupportedModelError: exit 2, nothing written).
"""

from __future__ import annotations

from ..errors import UnsupportedModelError


def auto_class_name(config) -> str:
    """"AutoModelForCausalLM" or "AutoModelForImageTextToText" for `config`; refuses any other."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None)
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "AutoModelForCausalLM"
    if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return "AutoModelForImageTextToText"
    classes = ", ".join(getattr(config, "architectures", None) or []) or type(config).__name__
    raise UnsupportedModelError(
        f"the base model's class {classes} (model_type {model_type!r}) is neither a causal language model nor "
        "an image-text-to-text model that transformers can load (AutoModelForCausalLM, "
        "AutoModelForImageTextToText); TIDE extends the text vocabulary of such models only. Use a causal "
        "LM checkpoint of it, if one exists")


def auto_class(config):
    import transformers

    return getattr(transformers, auto_class_name(config))
