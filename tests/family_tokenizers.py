"""Real tokenizers of the model families TIDE is tested on (tests/model_families.py).

llama.cpp keeps vocab-only GGUF files of the families it supports for its own tokenizer tests,
and the llama-cpp-python sdist on PyPI vendors them (with `.inp` texts and llama.cpp's
converter). scripts/setup.sh fetches that sdist into .cache/; transformers converts each GGUF
into a fast tokenizer once (tens of seconds for a 128k vocabulary), kept in a machine-wide cache
so clean clones reuse it. Two "original" layouts are derived from the GGUF conversions because
the families' own tokenizer.json files differ from them where it matters: Llama 3 and Qwen 2 keep
their special tokens as added tokens OUTSIDE the BPE vocabulary, and Llama 3 sets `ignore_merges`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SDIST = "llama-cpp-python==0.3.36"
SDIST_DIR = REPO / ".cache" / "llama-cpp-python"
# Converted tokenizers and built checkpoints outlive a checkout: converting the tokenizers alone
# takes about two minutes.
MACHINE_CACHE = Path(os.environ.get("TIDE_MODEL_FAMILIES_CACHE", Path.home() / ".cache" / "tide" / "model-families"))
TOKENIZER_CACHE = MACHINE_CACHE / f"tokenizers-{SDIST.split('==')[1]}"
_WANTED = ("/vendor/llama.cpp/models/ggml-vocab-", "/vendor/llama.cpp/convert_hf_to_gguf.py",
           "/vendor/llama.cpp/gguf-py/gguf/", "/vendor/llama.cpp/conversion/")


def llama_cpp_dir() -> Path:
    """The sdist's vendor/llama.cpp folder (vocab files, converter, gguf-py), fetched once."""
    root = next(SDIST_DIR.glob("llama_cpp_python-*/vendor/llama.cpp/models"), None)
    if root is None:
        SDIST_DIR.mkdir(parents=True, exist_ok=True)
        if not list(SDIST_DIR.glob("llama_cpp_python-*.tar.gz")):
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            SDIST, "-d", str(SDIST_DIR)], check=True)
        archive = next(SDIST_DIR.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if any(w in m.name for w in _WANTED)]
            tar.extractall(SDIST_DIR, members=members, filter="data")
        root = next(SDIST_DIR.glob("llama_cpp_python-*/vendor/llama.cpp/models"))
    return root.parent


@dataclass(frozen=True)
class Family:
    name: str  # how tables and test ids call it
    gguf: str | None  # llama.cpp's vocab file, "ggml-vocab-<gguf>.gguf"; None: a built-in model
    layout: str = "gguf"  # "gguf": as transformers converts it; "original": the family's own layout
    llama_cpp_pre: str | None = None  # the pre-tokenizer name llama.cpp's converter recognises


FAMILIES = {f.name: f for f in [
    Family("llama3", "llama-bpe", llama_cpp_pre="llama-bpe"),
    Family("llama3-original", "llama-bpe", layout="original", llama_cpp_pre="llama-bpe"),
    Family("qwen2", "qwen2", llama_cpp_pre="qwen2"),
    Family("qwen2-original", "qwen2", layout="original", llama_cpp_pre="qwen2"),
    Family("llama2-spm", "llama-spm"),  # Llama 2 / Mistral: SentencePiece-style BPE with byte fallback
    Family("phi3", "phi-3"),
    Family("deepseek-llm", "deepseek-llm", llama_cpp_pre="deepseek-llm"),
    Family("deepseek-coder", "deepseek-coder", llama_cpp_pre="deepseek-coder"),
    Family("falcon", "falcon", llama_cpp_pre="falcon"),
    Family("gpt2", "gpt-2", llama_cpp_pre="gpt-2"),
    Family("gpt-neox", "gpt-neox"),  # Mamba's (state-spaces mamba-*-hf)
    Family("smollm2", None, llama_cpp_pre="smollm"),
    Family("gemma3", None),
]}


def family_tokenizer_dir(name: str, model_sources=None) -> Path:
    """A folder with the family's tokenizer.json (+ config files), converted once and cached."""
    family = FAMILIES[name]
    return built_once(TOKENIZER_CACHE / name, "tokenizer.json", lambda staging: _convert(family, staging, model_sources))


def built_once(target: Path, marker: str, build) -> Path:
    """`target`, built by `build(staging folder)` unless it holds `marker` already. Under a file
    lock and renamed into place whole, so parallel test workers never read a half-built folder."""
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / marker).exists():
            staging = target.with_name(target.name + ".partial")
            build(staging)
            staging.rename(target)
    return target


def _convert(family: Family, folder: Path, model_sources) -> None:
    from transformers import AutoTokenizer

    if family.gguf is None:
        from extension.plan.models import builtin_tokenizer_dir

        source = builtin_tokenizer_dir({"smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}[family.name],
                                       model_sources.cache_dir)
        AutoTokenizer.from_pretrained(source).save_pretrained(folder)
        return
    if family.layout == "original":
        AutoTokenizer.from_pretrained(family_tokenizer_dir(family.name.removesuffix("-original"))).save_pretrained(folder)
        _original_layout(folder / "tokenizer.json", llama3=family.gguf == "llama-bpe")
        return
    models = llama_cpp_dir() / "models"
    try:
        tokenizer = AutoTokenizer.from_pretrained(models, gguf_file=f"ggml-vocab-{family.gguf}.gguf")
    except ValueError:
        tokenizer = gguf_tokenizer_only(models / f"ggml-vocab-{family.gguf}.gguf")
    tokenizer.save_pretrained(folder)


def gguf_tokenizer_only(path: Path):
    """A GGUF's tokenizer where transformers' GGUF loader refuses the file's architecture
    (GPT-NeoX): it checks the architecture for the weights it would read, while its tokenizer
    builder reads any byte-level BPE vocabulary."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, spec, config = get_gguf_tokenizer(str(path))
    backend, _ = convert_gguf_tokenizer(architecture, spec)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **{k: v for k, v in config.items() if v is not None})


def _original_layout(path: Path, *, llama3: bool) -> None:
    """The layout of the family's own tokenizer.json: special tokens only as added tokens, after
    the BPE vocabulary (GGUF conversion writes them into the vocabulary too); the padding tokens
    that GGUF adds up to the embedding size dropped; Llama 3 with `ignore_merges`."""
    spec = json.loads(path.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    kept = [token for token in spec["added_tokens"] if not token["content"].startswith("[PAD")]
    for token in spec["added_tokens"]:
        vocab.pop(token["content"], None)
    # transformers' GGUF conversion adds an <|endoftext|> after Llama 3's 256 specials; the original has none.
    spec["added_tokens"] = [t for t in kept if not (llama3 and t["id"] >= 128256)]
    if llama3:
        spec["model"]["ignore_merges"] = True
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    config_path = path.with_name("tokenizer_config.json")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    # As the families ship it: the special tokens listed in the config too (transformers' Qwen2
    # tokenizer class rebuilds its added tokens from this list).
    config["added_tokens_decoder"] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in spec["added_tokens"]}
    for key in ("eos_token", "pad_token", "bos_token", "unk_token"):
        if isinstance(config.get(key), str) and config[key] not in {t["content"] for t in spec["added_tokens"]} | set(vocab):
            config[key] = None
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")


def llama_cpp_pre_tokenizer(tokenizer) -> str | None:
    """The pre-tokenizer name llama.cpp's converter gives `tokenizer`, or None where it would
    refuse: the sha256 of the probe text's ids, looked up in the converter's own table."""
    import hashlib
    import re

    from extension.tokenizer import LLAMA_CPP_PROBE_TEXT

    digest = hashlib.sha256(str(tokenizer.encode(LLAMA_CPP_PROBE_TEXT)).encode()).hexdigest()
    source = (llama_cpp_dir() / "conversion" / "base.py").read_text(encoding="utf-8")
    found = re.search(rf'chkhsh == "{digest}":\s*\n(?:\s*#.*\n)*\s*res = "([^"]+)"', source)
    return found.group(1) if found else None


def inp_texts(family: str) -> list[str]:
    """llama.cpp's own tokenizer test texts for the family's vocab file (none for built-ins)."""
    gguf = FAMILIES[family].gguf
    path = llama_cpp_dir() / "models" / f"ggml-vocab-{gguf}.gguf.inp"
    if gguf is None or not path.exists():
        return []
    return [text for text in path.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n") if text]

