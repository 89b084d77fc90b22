"""What a run's checkpoints and cached contexts belong to: the base model and the new tokens.
Shared by the training loop (extension/training/loop.py) and the terms objective (extension/training/term_contexts.py)."""

from __future__ import annotations

import hashlib
import json


def run_identity(model, extended) -> dict:
    """What a checkpoint's rows belong to besides the settings: the base model (a digest of its
    config and a strided sample of its embedding and head, so a different checkpoint of the same
    architecture does not match) and the new tokens (strings, ids, original pieces)."""
    digest = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    for matrix in {id(m): m for m in (model.get_input_embeddings().weight, model.get_output_embeddings().weight)}.values():
        sample = matrix.detach()[:: max(1, matrix.shape[0] // 4096)].float().cpu().contiguous()
        digest.update(sample.numpy().tobytes())
    tokens = [[t.id, t.token, t.base_ids] for t in extended.new_tokens]
    return {
        "base_model": digest.hexdigest()[:16],
        "new_tokens": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
    }
