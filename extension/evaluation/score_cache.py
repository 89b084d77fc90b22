"""A disk cache of the base model's evaluation scores.

Every job scores the unextended base model on its held-out text and on the general English text
before it scores the extended model on the same text. The base model's score of a given text
never changes, so it is kept, keyed by:

- the base model: `model_fingerprint` — its config, and every parameter's name, shape, dtype and
  a strided sample of its values (a fine-tune that froze the embedding still differs in its
  layers, so sampling the embedding alone would not do);
- the text as the model sees it: the sha256 of the token id sequences scored (the chunks, cut by
  bytes and encoded with the base tokenizer after the context token), so a different text, cut,
  tokenizer or context token is a different key;
- what else changes the numbers: the device type (CPU and CUDA kernels round differently), the
  compute dtype, and SCORING_VERSION (bumped when evaluate.py's scoring changes).

Where: `<cache_dir>/scores/` — the cache folder the worker already keeps across jobs for the
converted built-in models (ModelSources.cache_dir, TIDE_CACHE_DIR), not the job's work folder,
which belongs to one job and is deleted when it ends (so a second job would never see it).
Each entry is a small JSON file of numbers (no text), written atomically.

Size: the folder is kept under `max_bytes` (TIDE_SCORE_CACHE_MAX_BYTES, default 100 MB) by
least-recently-used eviction. A read touches its entry's mtime (atime is unreliable: relatime and
noatime mounts), and each write, after it lands, removes the entries used longest ago until the
folder fits. Several workers may share the folder: an entry another one removed first is simply
gone, and a read that loses the race is a miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from ..plan.models import SCORE_CACHE_MAX_BYTES

SCORING_VERSION = 1
_SAMPLES_PER_TENSOR = 64


def model_fingerprint(model) -> str:
    """A digest of the model's config and of a strided sample of every parameter and buffer."""
    config = model.config.to_json_string(use_diff=False)
    digest = hashlib.sha256(config.encode())
    tensors = list(model.named_parameters(remove_duplicate=True)) + list(model.named_buffers())
    for name, tensor in tensors:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        if tensor.device.type == "meta" or tensor.numel() == 0:  # offloaded by accelerate: name and shape only
            continue
        flat = tensor.detach().reshape(-1)
        stride = max(1, flat.numel() // _SAMPLES_PER_TENSOR)
        sample = flat[::stride][:_SAMPLES_PER_TENSOR].to(device="cpu", dtype=torch.float64)
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()


def sequences_digest(sequences: list[list[int]]) -> str:
    digest = hashlib.sha256()
    for ids in sequences:
        digest.update(len(ids).to_bytes(4, "little"))
        digest.update(torch.tensor(ids, dtype=torch.int64).numpy().tobytes())
    return digest.hexdigest()


class ScoreCache:
    """Scores of one model, in `folder`. Build with `ScoreCache.for_model(folder, model)`."""

    def __init__(self, folder: Path | str, model_key: str, max_bytes: int = SCORE_CACHE_MAX_BYTES):
        self.folder = Path(folder)
        self.model_key = model_key
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0

    @classmethod
    def for_model(cls, folder: Path | str, model, max_bytes: int = SCORE_CACHE_MAX_BYTES) -> "ScoreCache":
        embedding = model.get_input_embeddings().weight
        key = json.dumps([SCORING_VERSION, model_fingerprint(model), embedding.device.type, str(embedding.dtype)])
        return cls(folder, hashlib.sha256(key.encode()).hexdigest(), max_bytes)

    def key(self, sequences: list[list[int]], **settings) -> str:
        text = json.dumps([self.model_key, sequences_digest(sequences), settings], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        path = self._path(key)
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.misses += 1
            return None
        self.hits += 1
        _touch(path)
        return value

    def put(self, key: str, value: dict) -> None:
        path = self._path(key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, tmp = tempfile.mkstemp(prefix=".score-", dir=path.parent)
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(value, out)
            os.replace(tmp, path)
        except OSError:  # a read-only or full cache folder costs the next job time, never this job
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
        evict_least_recently_used(self.folder, self.max_bytes)

    def report(self) -> dict:
        return {"hits": self.hits, "misses": self.misses}


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass  # removed meanwhile by another worker's eviction, or a read-only folder: still a hit


def evict_least_recently_used(folder: Path, max_bytes: int) -> int:
    """Remove the entries used longest ago until the folder's entries total at most `max_bytes`.
    Returns the bytes the entries keep."""
    entries = []
    for path in folder.glob("*/*.json"):
        try:
            stat = path.stat()
        except OSError:
            continue  # removed by another worker since the listing
        entries.append((stat.st_mtime_ns, path.name, stat.st_size, path))
    total = sum(size for _used, _name, size, _path in entries)
    for _used, _name, size, path in sorted(entries):
        if total <= max_bytes:
            break
        try:
            path.unlink(missing_ok=True)
        except OSError:
            continue  # a read-only folder: nothing to be done here, and the job goes on
        total -= size
    return total
