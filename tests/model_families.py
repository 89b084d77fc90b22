"""The model families TIDE is tested on, built from real tokenizers and tiny random weights.

Tokenizers: llama.cpp keeps vocab-only GGUF files of the families it supports for its own
tokenizer tests, and the llama-cpp-python sdist on PyPI vendors them (with `.inp` texts and
llama.cpp's converter). scripts/setup.sh fetches that sdist into .cache/; transformers converts
each GGUF into a fast tokenizer once (tens of seconds for a 128k vocabulary), kept in a
machine-wide cache so clean clones reuse it. Two "original" layouts are derived from the GGUF
conversions because the families' own tokenizer.json files differ from them where it matters:
Llama 3 and Qwen 2 keep their special tokens as added tokens OUTSIDE the BPE vocabulary, and
Llama 3 sets `ignore_merges`.

Weights: a tiny random model of the real architecture class built from a config (2 layers,
hidden 32), so only the tokenizer and the checkpoint handling are judged. Each case sets the
checkpoint properties users bring: tied or untied, fp32 or bf16, one file or sharded with an
index, and an embedding with more rows than the tokenizer has tokens.

Used by tests/test_model_families.py (every case through `tide extend`) and
benchmarks/model_families.py (the same cases, plus llama.cpp's converter, into a results table).
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
    Family("smollm2", None, llama_cpp_pre="smollm"),
    Family("gemma3", None),
]}


def family_tokenizer_dir(name: str, model_sources=None) -> Path:
    """A folder with the family's tokenizer.json (+ config files), converted once and cached."""
    from filelock import FileLock

    family = FAMILIES[name]
    target = TOKENIZER_CACHE / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / "tokenizer.json").exists():
            staging = target.with_name(target.name + ".partial")
            _convert(family, staging, model_sources)
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
    AutoTokenizer.from_pretrained(models, gguf_file=f"ggml-vocab-{family.gguf}.gguf").save_pretrained(folder)


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


# -- tiny random models of the real architecture classes ----------------------------------------
ARCHITECTURES = {  # class name -> (model_type, config options beyond the shared tiny shape)
    "LlamaForCausalLM": ("llama", {}),
    "Qwen2ForCausalLM": ("qwen2", {}),  # attention bias
    "MistralForCausalLM": ("mistral", {"sliding_window": None}),
    "Phi3ForCausalLM": ("phi3", {"pad_token_id": None}),  # fused qkv and gate_up projections
    "Qwen3ForCausalLM": ("qwen3", {"head_dim": 8}),
    "Gemma3ForCausalLM": ("gemma3_text", {"head_dim": 8, "sliding_window": 16}),  # scaled embeddings
    "Qwen3MoeForCausalLM": ("qwen3_moe", {"head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
                                          "moe_intermediate_size": 32}),
    "MixtralForCausalLM": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "GPT2LMHeadModel": ("gpt2", {"n_inner": 64}),
    # logits not the head's output as is (issue 40): Granite divides them, Cohere multiplies them
    "GraniteForCausalLM": ("granite", {"logits_scaling": 8.0}),
    "CohereForCausalLM": ("cohere", {"logit_scale": 16.0}),
}


@dataclass(frozen=True)
class Case:
    family: str
    architecture: str
    tied: bool
    dtype: str  # "float32" | "bfloat16"
    sharded: bool  # saved in 3+ safetensors files with model.safetensors.index.json
    padded_rows: int = 0  # embedding rows beyond every id the tokenizer uses
    train: bool = False  # also train the new rows for 2 steps on a small corpus (else --steps 0)

    @property
    def id(self) -> str:
        return "-".join([self.family, self.architecture.removesuffix("ForCausalLM").removesuffix("LMHeadModel").lower(),
                         "tied" if self.tied else "untied", {"float32": "fp32", "bfloat16": "bf16"}[self.dtype],
                         "sharded" if self.sharded else "1file"] + (["padded"] if self.padded_rows else [])
                        + (["trained"] if self.train else []))


# Every tokenizer at least once, every architecture at least once, each checkpoint property with
# two families or more.
CASES = [
    Case("llama3-original", "LlamaForCausalLM", tied=False, dtype="bfloat16", sharded=True),
    Case("llama3", "LlamaForCausalLM", tied=True, dtype="float32", sharded=False),
    Case("qwen2-original", "Qwen2ForCausalLM", tied=False, dtype="float32", sharded=False, padded_rows=290, train=True),
    Case("qwen2", "Qwen3ForCausalLM", tied=True, dtype="float32", sharded=False),
    Case("llama2-spm", "MistralForCausalLM", tied=False, dtype="bfloat16", sharded=True),
    Case("phi3", "Phi3ForCausalLM", tied=False, dtype="float32", sharded=False),
    Case("deepseek-llm", "Qwen3MoeForCausalLM", tied=False, dtype="bfloat16", sharded=True, train=True),
    Case("deepseek-coder", "MixtralForCausalLM", tied=False, dtype="float32", sharded=False),
    Case("falcon", "LlamaForCausalLM", tied=False, dtype="float32", sharded=False),
    # GPT-2's own class: paired with another architecture, transformers loads the tokenizer class
    # of that architecture instead, which pre-tokenizes differently.
    Case("gpt2", "GPT2LMHeadModel", tied=True, dtype="float32", sharded=False, padded_rows=47, train=True),
    Case("smollm2", "LlamaForCausalLM", tied=True, dtype="float32", sharded=False),
    # fp32: a CPU computes a 262k-row bf16 head many times slower, and bf16 is covered above
    Case("gemma3", "Gemma3ForCausalLM", tied=True, dtype="float32", sharded=True),
    # scaled logits, trained: the rows learn against the logits the model really gives
    Case("llama3", "GraniteForCausalLM", tied=False, dtype="float32", sharded=False, train=True),
    Case("qwen2", "CohereForCausalLM", tied=True, dtype="float32", sharded=False, train=True),
]
TERMS = ["ciprofloxacin", "immunohistochemistry", "SARS-CoV-2", "免疫组化", "naïveté"]
# Text with none of the new token strings: it must encode exactly as the base encodes it.
MIXED_TEXT = (
    "The quick brown fox jumps over 13 lazy dogs; 3.14159 != 2.71828.\n"
    "def area(r):\n\treturn 3.14 * r ** 2  # pi r squared\n\n"
    "东京是日本的首都。  Größe, naïve café — ¿qué tal?   \t  trailing spaces   \n"
    "    indented = {'a': [1, 2, 3]}\r\n<|not a special|> https://example.org/a?b=c#d"
)


def tokenizer_ids_end(tokenizer) -> int:
    """One past the largest id the tokenizer uses (vocabulary and added tokens)."""
    return max(max(tokenizer.get_vocab().values()) + 1, len(tokenizer))


def build_checkpoint(case: Case, folder: Path, model_sources=None) -> Path:
    """The case's base model folder: its family's tokenizer and a tiny random model of its
    architecture, saved in its dtype, tied or untied, one file or 3+ shards."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(family_tokenizer_dir(case.family, model_sources))
    model_type, options = ARCHITECTURES[case.architecture]
    special = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    config = AutoConfig.for_model(
        model_type, vocab_size=tokenizer_ids_end(tokenizer) + case.padded_rows, hidden_size=32,
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=case.tied,
        **{**{k: v for k, v in special.items() if v is not None}, **options},
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(getattr(torch, case.dtype))
    assert type(model).__name__ == case.architecture
    # Tiny layers, so a tiny limit: 3+ shards even where the embedding takes one of its own.
    model.save_pretrained(folder, max_shard_size="16KB" if case.sharded else "10GB")
    tokenizer.save_pretrained(folder)
    return folder


def inp_texts(family: str) -> list[str]:
    """llama.cpp's own tokenizer test texts for the family's vocab file (none for built-ins)."""
    gguf = FAMILIES[family].gguf
    path = llama_cpp_dir() / "models" / f"ggml-vocab-{gguf}.gguf.inp"
    if gguf is None or not path.exists():
        return []
    return [text for text in path.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n") if text]


# -- what every published folder must satisfy ---------------------------------------------------
def safetensors_layout(folder: Path) -> dict:
    """{"files": n, "index": bool, "dtypes": {...}, "complete": index covers every tensor}."""
    from extension.plan.devices import safetensors_header

    files = sorted(folder.glob("*.safetensors"))
    index_path = folder / "model.safetensors.index.json"
    tensors: dict[str, str] = {}
    dtypes: set[str] = set()
    for file in files:
        for name, entry in safetensors_header(file).items():
            if name != "__metadata__":
                tensors[name] = file.name
                dtypes.add(entry["dtype"])
    complete = True
    if index_path.exists():
        weight_map = json.loads(index_path.read_text())["weight_map"]
        complete = weight_map == tensors
    return {"files": len(files), "index": index_path.exists(), "dtypes": dtypes, "complete": complete}


def check_published(case: Case, base_dir: Path, out_dir: Path) -> dict[str, str]:
    """Every check of the issue, on one published folder: check -> "" when it holds, else why not."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    results: dict[str, str] = {}
    extension = json.loads((out_dir / "tide_extension.json").read_text())
    base_tok = AutoTokenizer.from_pretrained(base_dir)
    tok = AutoTokenizer.from_pretrained(out_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype="auto")
    adapted = None
    try:
        resized = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
        resized.resize_token_embeddings(model.get_input_embeddings().weight.shape[0], mean_resizing=False)
        adapted = PeftModel.from_pretrained(resized, out_dir / "adapter").eval()
        results["loads"] = ""
    except Exception as exc:  # noqa: BLE001 - the check reports any failure to load
        results["loads"] = f"the adapter does not load: {exc}"[:300]

    old, new = base_tok.get_vocab(), tok.get_vocab()
    moved = [(s, i, new.get(s)) for s, i in old.items() if new.get(s) != i]
    owners: dict[int, list[str]] = {}
    for string, token_id in new.items():
        owners.setdefault(token_id, []).append(string)
    shared = [strings for strings in owners.values() if len(strings) > 1]
    specials = [name for name in ("bos_token_id", "eos_token_id", "pad_token_id")
                if getattr(model.config, name, None) is not None and getattr(model.config, name) != getattr(base.config, name)]
    results["old_ids"] = "; ".join(filter(None, [
        f"{len(moved)} old tokens moved, e.g. {moved[:3]}" if moved else "",
        f"ids with two tokens: {shared[:3]}" if shared else "",
        f"config {specials} changed" if specials else ""]))

    rows = base.get_input_embeddings().weight.shape[0]
    same_input = torch.equal(model.get_input_embeddings().weight[:rows], base.get_input_embeddings().weight)
    same_head = torch.equal(model.get_output_embeddings().weight[:rows], base.get_output_embeddings().weight)
    results["old_rows"] = "" if same_input and same_head else f"old rows changed (input same: {same_input}, head same: {same_head})"

    split = []
    for term in extension["terms"]:
        for text, form in term["forms"].items():
            context = f"{text} is" if not text.startswith(" ") else f"the{text} is"
            if form["id"] not in tok(context, add_special_tokens=False).input_ids:
                split.append(f"{context!r}: {tok.tokenize(context)}")
    results["one_token"] = "; ".join(split[:3])

    texts = [MIXED_TEXT] + inp_texts(case.family)
    new_strings = [t["text"] for t in extension["new_tokens"]]
    plain = [t for t in texts if not any(s.strip() and s.strip() in t for s in new_strings)]
    changed = [t for t in plain if tok(t, add_special_tokens=False).input_ids != base_tok(t, add_special_tokens=False).input_ids]
    results["same_ids_on_plain_text"] = f"{len(changed)} of {len(plain)} texts encode differently, e.g. {changed[0][:60]!r}" if changed else ""

    with_terms = "In the " + ", ".join(term["term"] for term in extension["terms"]) + " study."
    round_trip = tok.decode(tok(with_terms, add_special_tokens=False).input_ids)
    base_round_trip = base_tok.decode(base_tok(with_terms, add_special_tokens=False).input_ids)
    results["decodes"] = "" if round_trip in (with_terms, base_round_trip) else f"{with_terms!r} decodes as {round_trip!r}"

    # base + adapter predicts as the merged folder on text with the new tokens (issue 37: an
    # untied model's adapter once lacked the head's new rows)
    if adapted is None:
        results["adapter_logits"] = "n/a"
    else:
        ids = torch.tensor([tok(with_terms, add_special_tokens=False).input_ids])
        with torch.no_grad():
            difference = (adapted(ids).logits.float() - model(ids).logits.float()).abs().max().item()
        results["adapter_logits"] = "" if difference == 0 else f"base + adapter logits differ from the merged folder's by {difference:.4g}"

    base_layout, layout = safetensors_layout(base_dir), safetensors_layout(out_dir)
    tied_now = model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    problems = []
    if layout["dtypes"] != base_layout["dtypes"]:
        problems.append(f"dtypes {sorted(layout['dtypes'])} (base {sorted(base_layout['dtypes'])})")
    if tied_now != case.tied or bool(model.config.tie_word_embeddings) != case.tied:
        problems.append(f"tied {tied_now} (base {case.tied})")
    if base_layout["index"] and not (layout["index"] and layout["files"] > 1 and layout["complete"]):
        problems.append(f"{layout['files']} file(s), index {layout['index']}, complete {layout['complete']}")
    results["layout"] = "; ".join(problems)

    base_pre = llama_cpp_pre_tokenizer(base_tok)
    if base_pre is None:
        results["llama_cpp_pre_tokenizer"] = "n/a"
    else:
        pre = llama_cpp_pre_tokenizer(tok)
        results["llama_cpp_pre_tokenizer"] = "" if pre == base_pre else f"{pre} (base {base_pre})"
    return results


def base_checkpoint(case: Case, model_sources=None) -> Path:
    """The case's base model folder, built once per machine (keyed by this file's contents, so a
    change to how cases are built builds them again)."""
    import hashlib

    from filelock import FileLock

    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    target = MACHINE_CACHE / "models" / digest / case.id
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / "config.json").exists():
            staging = target.with_name(target.name + ".partial")
            build_checkpoint(case, staging, model_sources)
            staging.rename(target)
    return target


def corpus_text() -> str:
    """A small real corpus for the cases that train: FOLDOC entries that name the terms' kind of
    text (any real text works; the weights are random)."""
    import gzip

    with gzip.open("/usr/share/dictd/foldoc.dict.dz", "rt", encoding="utf-8", errors="replace") as handle:
        text = handle.read(400_000)
    blocks = [" ".join(block.split()) for block in text.split("\n\n")]
    return "\n\n".join(block for block in blocks if len(block) > 80)


def extend_args(case: Case, base: Path, out: Path, terms_file: Path, corpus_file: Path) -> list[str]:
    """`tide extend` arguments for a case: init only, or 2 training steps on the corpus with every term kept."""
    args = ["extend", "--base-model", str(base), "--terms", str(terms_file), "--eval-bytes", "1000", "--out", str(out)]
    if case.train:
        return args + ["--corpus", str(corpus_file), "--steps", "2", "--batch-size", "2", "--seq-len", "64", "--keep-all-terms"]
    return args + ["--steps", "0"]
