"""Issue 40 item 3: multimodal bases. A LLaVA checkpoint (tiny, random, with a real processor:
CLIP image processor + Llama 2's tokenizer with an <image> token) goes through `tide extend`:
it loads through AutoModelForImageTextToText, its processor files are carried over so
AutoProcessor loads the published folder, the image token and the vision tower stay untouched,
and image + text forward runs with the new tokens. A class that neither Auto class can load is
refused with exit 2, the class named, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app.cli import main
from tests.model_families import family_tokenizer_dir

TERMS = ["ciprofloxacin", "immunohistochemistry"]


def build_llava(folder: Path, model_sources=None) -> Path:
    from transformers import (AutoTokenizer, CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    tokenizer = AutoTokenizer.from_pretrained(family_tokenizer_dir("llama2-spm", model_sources))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    text = LlamaConfig(vocab_size=32064, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=512)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=28, patch_size=14)
    config = LlavaConfig(vision_config=vision.to_dict(), text_config=text.to_dict(), image_token_index=image_id,
                         vision_feature_layer=-1, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).eval().save_pretrained(folder)
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}),
        tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory, model_sources):
    return build_llava(tmp_path_factory.mktemp("llava") / "base", model_sources)


def _terms(tmp_path: Path) -> Path:
    path = tmp_path / "terms.txt"
    path.write_text("\n".join(TERMS) + "\n", encoding="utf-8")
    return path


def test_llava_is_extended_and_its_processor_carried_over(llava_dir, cli_env, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "out"
    assert main(["extend", "--base-model", str(llava_dir), "--terms", str(_terms(tmp_path)), "--steps", "0",
                 "--eval-bytes", "1000", "--out", str(out)]) == 0
    for name in ("processor_config.json", "preprocessor_config.json"):
        if (llava_dir / name).exists():
            assert (out / name).exists(), name
    manifest = {entry["path"] for entry in json.loads((out / "manifest.json").read_text())["files"]}
    assert "processor_config.json" in manifest

    base = AutoModelForImageTextToText.from_pretrained(llava_dir)
    model = AutoModelForImageTextToText.from_pretrained(out)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    rows = base.get_input_embeddings().weight.shape[0]
    assert torch.equal(model.get_input_embeddings().weight[:rows], base.get_input_embeddings().weight)
    assert torch.equal(model.get_output_embeddings().weight[:rows], base.get_output_embeddings().weight)
    base_vision = {k: v for k, v in base.state_dict().items() if "vision" in k or "projector" in k}
    vision = {k: v for k, v in model.state_dict().items() if "vision" in k or "projector" in k}
    assert vision.keys() == base_vision.keys() and all(torch.equal(vision[k], base_vision[k]) for k in vision)
    assert model.config.image_token_index == base.config.image_token_index

    processor = AutoProcessor.from_pretrained(out)
    text = "<image> The immunohistochemistry of ciprofloxacin."
    inputs = processor(text=text, images=torch.zeros(3, 28, 28, dtype=torch.uint8), return_tensors="pt")
    new_ids = [t["id"] for t in json.loads((out / "tide_extension.json").read_text())["new_tokens"]]
    assert set(new_ids) & set(inputs["input_ids"][0].tolist())
    with torch.no_grad():
        logits = model(**inputs).logits
    assert torch.isfinite(logits).all()
    # old-token logits on plain text unchanged
    plain = processor.tokenizer("The quick brown fox.", return_tensors="pt")
    with torch.no_grad():
        before = base(**plain).logits
        after = model(**plain).logits[..., : before.shape[-1]]
    assert torch.allclose(before, after, atol=1e-5)


def test_a_class_no_auto_class_loads_is_refused_naming_it(llava_dir, cli_env, tmp_path, capsys):
    """T5 (an encoder-decoder) is neither a causal LM nor an image-text-to-text model: exit 2
    before any weights are read (there are none), the class named, nothing written."""
    from transformers import AutoTokenizer, T5Config

    base = tmp_path / "base"
    AutoTokenizer.from_pretrained(llava_dir).save_pretrained(base)
    config = T5Config(vocab_size=32064, d_model=32, d_ff=64, num_layers=2, num_heads=4)
    config.architectures = ["T5ForConditionalGeneration"]
    config.save_pretrained(base)
    out = tmp_path / "out"
    assert main(["extend", "--base-model", str(base), "--terms", str(_terms(tmp_path)), "--steps", "0",
                 "--out", str(out)]) == 2
    assert "T5ForConditionalGeneration" in capsys.readouterr().err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["base", "terms.txt"]


def build_qwen2_vl(folder: Path, model_sources=None) -> Path:
    """A tiny random Qwen2-VL with Qwen 2's tokenizer and its vision tokens. No processor is saved:
    Qwen2VLProcessor needs torchvision (its video processor), and the only torchvision wheel on
    these machines is a CUDA build that cannot load beside the CPU torch; the image input is built
    here the way the processor builds it (patches of 3 x 2 x 14 x 14, one <|image_pad|> per 2 x 2)."""
    from transformers import AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(family_tokenizer_dir("qwen2", model_sources))
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
    Qwen2VLForConditionalGeneration(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_qwen2_vl_is_extended_with_its_vision_tower_untouched(cli_env, tmp_path, model_sources):
    """Issue 40 item 3: before, `tide extend` refused Qwen2-VL with a raw traceback and exit 1
    (no AutoModelForCausalLM mapping)."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    base_dir = build_qwen2_vl(tmp_path / "base", model_sources)
    out = tmp_path / "out"
    assert main(["extend", "--base-model", str(base_dir), "--terms", str(_terms(tmp_path)), "--steps", "0",
                 "--eval-bytes", "1000", "--out", str(out)]) == 0
    base = AutoModelForImageTextToText.from_pretrained(base_dir)
    model = AutoModelForImageTextToText.from_pretrained(out)
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    rows = base.get_input_embeddings().weight.shape[0]
    assert torch.equal(model.get_input_embeddings().weight[:rows], base.get_input_embeddings().weight)
    assert torch.equal(model.get_output_embeddings().weight[:rows], base.get_output_embeddings().weight)
    base_vision = {k: v for k, v in base.state_dict().items() if "visual" in k}
    vision = {k: v for k, v in model.state_dict().items() if "visual" in k}
    assert base_vision and vision.keys() == base_vision.keys()
    assert all(torch.equal(vision[k], base_vision[k]) for k in vision)
    for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        assert getattr(model.config, name) == getattr(base.config, name), name

    tokenizer = AutoTokenizer.from_pretrained(out)
    inputs = tokenizer("<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|> The immunohistochemistry of "
                       "ciprofloxacin.", return_tensors="pt")
    new_ids = [t["id"] for t in json.loads((out / "tide_extension.json").read_text())["new_tokens"]]
    assert set(new_ids) & set(inputs["input_ids"][0].tolist())
    torch.manual_seed(1)
    with torch.no_grad():  # one 4 x 4 grid of patches, merged 2 x 2 into the four <|image_pad|> tokens
        logits = model(**inputs, pixel_values=torch.randn(16, 3 * 2 * 14 * 14), image_grid_thw=torch.tensor([[1, 4, 4]]),
                       mm_token_type_ids=(inputs["input_ids"] == model.config.image_token_id).long()).logits
    assert torch.isfinite(logits).all()
    plain = tokenizer("The quick brown fox.", return_tensors="pt")
    with torch.no_grad():
        before = base(**plain).logits
        after = model(**plain).logits[..., : before.shape[-1]]
    assert torch.allclose(before, after, atol=1e-5)


def build_gemma3_multimodal(folder: Path, tokenizer_dir: Path) -> Path:
    """A tiny random Gemma 3 (4B+ layout: Gemma3ForConditionalGeneration, SigLIP tower, 262,208-row
    text vocab holding <image_soft_token>) with the real Gemma 3 tokenizer and a Gemma3Processor."""
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
    Gemma3ForConditionalGeneration(config).eval().save_pretrained(folder)
    Gemma3Processor(image_processor=Gemma3ImageProcessor(size={"height": 28, "width": 28}), tokenizer=tokenizer,
                    image_seq_length=4, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}"
                    ).save_pretrained(folder)
    return folder


def test_gemma3_multimodal_keeps_its_processor(cli_env, tmp_path, gemma3_tokenizer_path):
    """Issue 40 item 3: AutoProcessor loads the published Gemma 3 folder (processor config and
    chat template carried over) and image + text with the new tokens runs."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    base_dir = build_gemma3_multimodal(tmp_path / "base", gemma3_tokenizer_path)
    out = tmp_path / "out"
    assert main(["extend", "--base-model", str(base_dir), "--terms", str(_terms(tmp_path)), "--steps", "0",
                 "--eval-bytes", "1000", "--out", str(out)]) == 0
    for name in ("processor_config.json", "preprocessor_config.json", "chat_template.jinja", "chat_template.json"):
        assert (out / name).exists() == (base_dir / name).exists(), name
    base = AutoModelForImageTextToText.from_pretrained(base_dir)
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    assert type(processor).__name__ == "Gemma3Processor"
    rows = base.get_input_embeddings().weight.shape[0]
    assert torch.equal(model.get_input_embeddings().weight[:rows], base.get_input_embeddings().weight)
    base_vision = {k: v for k, v in base.state_dict().items() if "vision" in k or "projector" in k}
    vision = {k: v for k, v in model.state_dict().items() if "vision" in k or "projector" in k}
    assert base_vision and vision.keys() == base_vision.keys()
    assert all(torch.equal(vision[k], base_vision[k]) for k in vision)

    inputs = processor(text="<start_of_image> The immunohistochemistry of ciprofloxacin.",
                       images=torch.zeros(3, 28, 28, dtype=torch.uint8), return_tensors="pt")
    new_ids = [t["id"] for t in json.loads((out / "tide_extension.json").read_text())["new_tokens"]]
    assert set(new_ids) & set(inputs["input_ids"][0].tolist())
    with torch.no_grad():
        assert torch.isfinite(model(**inputs).logits).all()
    plain = processor.tokenizer("The quick brown fox.", return_tensors="pt")
    with torch.no_grad():
        before = base(**plain).logits
        after = model(**plain).logits[..., : before.shape[-1]]
    assert torch.allclose(before, after, atol=1e-5)
