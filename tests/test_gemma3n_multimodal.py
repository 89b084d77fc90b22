"""Gemma 3n's multimodal class (issue 40 item 1): Gemma3nForConditionalGeneration, the layout of
the real E2B/E4B checkpoints, with its timm vision tower, an audio encoder and its processor
(tests/multimodal_models.build_gemma3n_multimodal), through `tide extend` with 2 training steps.

Its `Gemma3nModel` sends every id from 262,144 up to the vision and audio embedders, so new rows
must sit on reserved text ids in the published folder, and while training (where the adapter
appends them past the vocabulary) the text must go through the text decoder, not the wrapper:
before that, the job's first training batch raised IndexError in the audio embedder.

timm needs torchvision, which only loads here through tests/vision_libs.py, so the job and its
checks run in a subprocess started by that launcher: this file is both the test and (run as a
module) the job. Checked: every check of tests/published_checks.py (the processor, the per-layer
rows, the vision and audio towers bit-identical, the adapter...), and with an image before plain
text the old tokens' logits are the base's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAIN = "The cat sat on the mat because it was warm there."  # no new term in it


def run_job(out: Path) -> dict:
    """The case's job and its checks (under tests/vision_libs.py): build the base once per
    machine, extend it through the CLI, check it, and return what was found."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from extension.plan.models import ModelSources
    from tests.conftest import CACHE
    from tests.model_families import GEMMA3N_MULTIMODAL, base_checkpoint, check_published, extend_case, work_folder
    from tests.multimodal_models import image_text_inputs

    torch.set_num_threads(1)
    case = GEMMA3N_MULTIMODAL
    base = base_checkpoint(case, ModelSources(cache_dir=CACHE))
    extend_case(case, base, out)
    checks = check_published(case, base, out, work_folder(out))

    extension = json.loads((out / "tide_extension.json").read_text())
    new_ids = [token["id"] for token in extension["new_tokens"]]
    processor = AutoProcessor.from_pretrained(out)
    before_model = AutoModelForImageTextToText.from_pretrained(base).eval()
    after_model = AutoModelForImageTextToText.from_pretrained(out).eval()
    inputs = image_text_inputs(after_model, out, PLAIN, processor=processor)
    with torch.no_grad():
        before = before_model(**inputs).logits.float()
        after = after_model(**inputs).logits.float()
    old = torch.ones(before.shape[-1], dtype=torch.bool)
    old[new_ids] = False  # a taken reserved id's logit is the new token's
    image_tokens = int((inputs["input_ids"] == after_model.config.image_token_id).sum())
    return {"class": type(after_model).__name__, "checks": checks, "new_ids": new_ids,
            "vocab_size": after_model.config.text_config.vocab_size, "image_tokens": image_tokens,
            "image_text_old_logits_difference": (after[..., old] - before[..., old]).abs().max().item()}


def test_a_gemma3n_multimodal_job_passes_every_check_and_keeps_image_text_logits(tmp_path):
    from tests.vision_libs import missing

    assert not missing(), missing()
    result_file = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TIDE_DATA_DIR": str(tmp_path / "tide-data"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.vision_libs", "tests.test_gemma3n_multimodal",
                           str(tmp_path / "out"), str(result_file)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(result_file.read_text())
    assert result["class"] == "Gemma3nForConditionalGeneration"
    failed = {check: why for check, why in result["checks"].items() if why not in ("", "n/a")}
    assert not failed, failed
    for check in ("processor", "trained_rows", "reserved_ids", "old_rows", "other_weights", "adapter_logits"):
        assert result["checks"][check] == "", check
    assert result["vocab_size"] == 262400 and max(result["new_ids"]) < 262144  # text ids, no growth
    assert result["image_tokens"] == 256
    assert result["image_text_old_logits_difference"] <= 1e-5


if __name__ == "__main__":
    out, result_file = Path(sys.argv[1]), Path(sys.argv[2])
    result_file.write_text(json.dumps(run_job(out), indent=1))
