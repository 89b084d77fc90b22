"""Tiny random multimodal models whose text vocabulary holds image tokens (issue 40 item 3), each
with a real tokenizer of its family and, where it can be built here, its real processor.

torchvision cannot be installed into .venv on these machines (PyPI's wheel is a CUDA build that
breaks the CPU torch), so processors are the PIL-based ones: CLIP's for LLaVA, Gemma 3's own for
Gemma 3, SigLIP's for Gemma 3n. Qwen2-VL's processor needs torchvision for its video processor, so
the Qwen2-VL folder has none and its image input is built the way that processor builds it.
Gemma 3n's vision tower is a timm model: it is built and run only under tests/vision_libs.py.

Used by tests/test_multimodal.py and by the model-family matrix (tests/model_families.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _save(model, folder: Path, dtype: str, sharded: bool) -> None:
    # Tiny layers, so a tiny limit: 3+ shards even where the embedding takes one of its own.
    model.to(getattr(torch, dtype)).eval().save_pretrained(folder, max_shard_size="16KB" if sharded else "10GB")


def build_llava(folder: Path, tokenizer_dir: Path, *, dtype: str = "float32", sharded: bool = False) -> Path:
    """LLaVA: Llama 2's tokenizer with an <image> token, a CLIP vision tower, untied, and a
    LlavaProcessor (CLIP image processor)."""
    from transformers import (AutoTokenizer, CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    text = LlamaConfig(vocab_size=32064, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=512)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=28, patch_size=14)
    config = LlavaConfig(vision_config=vision.to_dict(), text_config=text.to_dict(), image_token_index=image_id,
                         vision_feature_layer=-1, tie_word_embeddings=False)
    torch.manual_seed(0)
    _save(LlavaForConditionalGeneration(config), folder, dtype, sharded)
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}),
        tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(folder)
    return folder


def build_qwen2_vl(folder: Path, tokenizer_dir: Path, *, dtype: str = "float32", sharded: bool = False) -> Path:
    """Qwen2-VL: Qwen 2's tokenizer with its vision tokens, untied, no processor (see above)."""
    from transformers import AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    vision_tokens = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": vision_tokens})
    start, end, image, video = tokenizer.convert_tokens_to_ids(vision_tokens)
    text = dict(vocab_size=len(tokenizer) + 64 - len(tokenizer) % 64, hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]})
    vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, vision_start_token_id=start,
                           vision_end_token_id=end, image_token_id=image, video_token_id=video,
                           tie_word_embeddings=False)
    torch.manual_seed(0)
    _save(Qwen2VLForConditionalGeneration(config), folder, dtype, sharded)
    tokenizer.save_pretrained(folder)
    return folder


def build_gemma3_multimodal(folder: Path, tokenizer_dir: Path, *, dtype: str = "float32", sharded: bool = False) -> Path:
    """Gemma 3 4B+ layout: Gemma3ForConditionalGeneration, a SigLIP tower, a 262,208-row text
    vocabulary holding <image_soft_token>, tied, with the real Gemma 3 tokenizer and a Gemma3Processor."""
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, extra_special_tokens={
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
    text = dict(vocab_size=262208, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, sliding_window=16, max_position_embeddings=512)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          image_token_index=tokenizer.convert_tokens_to_ids("<image_soft_token>"),
                          boi_token_index=tokenizer.convert_tokens_to_ids("<start_of_image>"),
                          eoi_token_index=tokenizer.convert_tokens_to_ids("<end_of_image>"))
    torch.manual_seed(0)
    _save(Gemma3ForConditionalGeneration(config), folder, dtype, sharded)
    Gemma3Processor(image_processor=Gemma3ImageProcessor(size={"height": 28, "width": 28}), tokenizer=tokenizer,
                    image_seq_length=4, chat_template=CHAT_TEMPLATE).save_pretrained(folder)
    return folder


def build_gemma3n_multimodal(folder: Path, tokenizer_dir: Path, *, dtype: str = "float32", sharded: bool = False) -> Path:
    """Gemma 3n E2B/E4B layout: Gemma3nForConditionalGeneration with the text model of
    tests/model_families.build_gemma3n_text (262,400 input rows, a 262,144-row per-layer table),
    its MobileNet V5 vision tower (timm's real architecture at 1/16 of its channels), a one-layer
    audio encoder, and a Gemma3nProcessor (SigLIP image processor at 64 x 64, which the tower turns
    into the model's 256 image tokens). The Gemma 3 tokenizer's image tokens stand in for Gemma 3n's,
    with its audio tokens added after them; ids from 262,144 up go to the vision and audio embedders,
    as in the real model. Needs timm (tests/vision_libs.py)."""
    from transformers import (AutoTokenizer, Gemma3nAudioFeatureExtractor, Gemma3nConfig,
                              Gemma3nForConditionalGeneration, Gemma3nProcessor, SiglipImageProcessor)

    from tests.model_families import gemma3n_text_options, open_altup  # imports this module: not at the top

    special = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
               "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>", "audio_token": "<audio_soft_token>"}
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, extra_special_tokens=special)
    token_ids = {name + "_id": tokenizer.convert_tokens_to_ids(token) for name, token in special.items()}
    text = gemma3n_text_options(tokenizer)
    audio = dict(hidden_size=32, conf_num_attention_heads=2, conf_num_hidden_layers=1, sscp_conv_channel_size=[8, 8])
    vision = dict(architecture="mobilenetv5_300m_enc", model_args={"channel_multiplier": 0.0625})
    config = Gemma3nConfig(text_config=text, audio_config=audio, vision_config=vision, vision_soft_tokens_per_image=256,
                           **token_ids)
    torch.manual_seed(0)
    model = Gemma3nForConditionalGeneration(config)
    open_altup(model.model.language_model.layers)
    model.to(getattr(torch, dtype)).eval().save_pretrained(folder, max_shard_size="4MB" if sharded else "10GB")
    Gemma3nProcessor(feature_extractor=Gemma3nAudioFeatureExtractor(),
                     image_processor=SiglipImageProcessor(size={"height": 64, "width": 64}), tokenizer=tokenizer,
                     image_seq_length=256, chat_template=CHAT_TEMPLATE).save_pretrained(folder)
    return folder


# class name -> (the family whose tokenizer it carries, its builder)
MULTIMODAL = {
    "LlavaForConditionalGeneration": ("llama2-spm", build_llava),
    "Qwen2VLForConditionalGeneration": ("qwen2", build_qwen2_vl),
    "Gemma3ForConditionalGeneration": ("gemma3", build_gemma3_multimodal),
    "Gemma3nForConditionalGeneration": ("gemma3", build_gemma3n_multimodal),
}


def image_text_inputs(model, folder: Path, text: str, *, processor=None, tokenizer=None) -> dict:
    """The model's inputs for one blank image (28 x 28; Gemma 3n: 64 x 64) followed by `text`, as the folder's own
    processor makes them (Qwen2-VL: as its processor would, from the folder's tokenizer). Pass the
    folder's processor or tokenizer where they are loaded already (Gemma 3's take seconds)."""
    from transformers import AutoProcessor, AutoTokenizer

    name = type(model).__name__
    if name == "Qwen2VLForConditionalGeneration":
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(folder)
        inputs = dict(tokenizer("<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|> " + text, return_tensors="pt"))
        generator = torch.Generator().manual_seed(1)
        # one 4 x 4 grid of 3 x 2 x 14 x 14 patches, merged 2 x 2 into the four <|image_pad|> tokens
        inputs.update(pixel_values=torch.randn(16, 3 * 2 * 14 * 14, generator=generator).to(model.dtype),
                      image_grid_thw=torch.tensor([[1, 4, 4]]),
                      mm_token_type_ids=(inputs["input_ids"] == model.config.image_token_id).long())
        return inputs
    image_marker = {"LlavaForConditionalGeneration": "<image>", "Gemma3ForConditionalGeneration": "<start_of_image>",
                    "Gemma3nForConditionalGeneration": "<image_soft_token>"}[name]
    side = 64 if name == "Gemma3nForConditionalGeneration" else 28
    processor = processor or AutoProcessor.from_pretrained(folder)
    inputs = dict(processor(text=f"{image_marker} {text}", images=torch.zeros(3, side, side, dtype=torch.uint8),
                            return_tensors="pt"))
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
    return inputs
