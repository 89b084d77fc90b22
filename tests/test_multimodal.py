"""Issue 40 item 3: multimodal bases. A LLaVA checkpoint (tiny, random, with a real processor:
CLIP image processor + Llama 2's tokenizer with an <image> token) goes through `tide extend`:
it loads through AutoModelForImageTextToText, its processor files are carried over so
AutoProcessor loads the published folder, the image token and the vision tower stay untouched,
and image + text forward runs with the new tokens. A class that neither Auto class can load is
refused with exit 2, the class named, nothing written.

Qwen2-VL and Gemma 3 multimodal (with its processor) are rows of the model-family matrix
(tests/model_families.py), which checks the same of every multimodal case and more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app.cli import main
from tests.model_families import family_tokenizer_dir
from tests.multimodal_models import build_llava

TERMS = ["ciprofloxacin", "immunohistochemistry"]


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory, model_sources):
    return build_llava(tmp_path_factory.mktemp("llava") / "base", family_tokenizer_dir("llama2-spm", model_sources))


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
