"""The model families TIDE is tested on, built from real tokenizers and tiny random weights.

Tokenizers: the families' own, from llama.cpp's vocab-only GGUF files or the built-in models
(tests/family_tokenizers.py).

Weights: a tiny random model of the real architecture class built from a config (2 layers,
hidden 32), so only the tokenizer, the embedding layout and the checkpoint handling are judged.
Each case sets the checkpoint properties users bring: tied or untied, fp32 or bf16, one file or
sharded with an index, an embedding with more rows than the tokenizer has tokens (or padded to a
multiple of 128), and the embedding layouts beyond one matrix (issue 40): an embedding LayerNorm
(BLOOM), a projected embedding (OPT), scaled logits (Granite, Cohere), a state-space model
(Mamba), Gemma 3n's per-layer table (`embed_tokens_per_layer`, 262,144 rows beside 262,400 input
rows), and multimodal classes whose text vocabulary holds image tokens (tests/multimodal_models.py).
Cases with `new_ids="reserved"` put the new terms on the tokenizer's reserved unused tokens
(Gemma's `<unusedN>`, Llama 3's `<|reserved_special_token_N|>`) instead of growing the vocabulary.

Used by tests/test_model_families.py (every case through `tide extend`; two of them in their own
files, see CHECKED_ELSEWHERE) and
benchmarks/model_families.py (the same cases, plus llama.cpp's converter, into a results table);
tests/published_checks.py says what every published folder must satisfy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tests.family_tokenizers import (  # noqa: F401 - the matrix's users import these from here
    FAMILIES, MACHINE_CACHE, SDIST, family_tokenizer_dir, inp_texts, llama_cpp_dir, llama_cpp_pre_tokenizer,
)
from tests.multimodal_models import MULTIMODAL
from tests.published_checks import MIXED_TEXT, check_published, safetensors_layout, tokenizer_ids_end  # noqa: F401

# -- tiny random models of the real architecture classes ----------------------------------------
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512)
OMIT = "omit"  # an option of SHAPE the architecture's config does not take
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
    # a LayerNorm between the embedding and the first layer
    "BloomForCausalLM": ("bloom", {"intermediate_size": OMIT, "num_key_value_heads": OMIT,
                                   "max_position_embeddings": OMIT}),
    # OPT-350m's layout: rows narrower than the hidden size, project_in / project_out around the layers
    "OPTForCausalLM": ("opt", {"word_embed_proj_dim": 16, "ffn_dim": 64, "intermediate_size": OMIT,
                               "num_key_value_heads": OMIT}),
    # no attention; fp32 hidden states meet the head in its dtype (issue 40 item 5)
    "MambaForCausalLM": ("mamba", {"state_size": 8, "num_attention_heads": OMIT, "num_key_value_heads": OMIT,
                                   "max_position_embeddings": OMIT}),
}


@dataclass(frozen=True)
class Case:
    family: str
    architecture: str
    tied: bool
    dtype: str  # "float32" | "bfloat16"
    sharded: bool  # saved in 3+ safetensors files with model.safetensors.index.json
    padded_rows: int = 0  # embedding rows beyond every id the tokenizer uses
    pad_to: int = 0  # embedding rows rounded up to this multiple (0: not)
    train: bool = False  # also train the new rows for 2 steps on a small corpus (else --steps 0)
    new_ids: str = ""  # `--new-ids` ("reserved"); "": the default ('auto')

    @property
    def auto_class(self) -> str:
        """The transformers Auto class the family's checkpoints load with."""
        return "AutoModelForImageTextToText" if self.architecture in MULTIMODAL else "AutoModelForCausalLM"

    @property
    def id(self) -> str:
        short = self.architecture
        # a multimodal class is marked: Gemma 3n's text and multimodal cases share everything else
        for suffix, mark in (("ForCausalLM", ""), ("LMHeadModel", ""), ("ForConditionalGeneration", "-multimodal")):
            if short.endswith(suffix):
                short = short.removesuffix(suffix) + mark
        return "-".join([self.family, short.lower(), "tied" if self.tied else "untied",
                         {"float32": "fp32", "bfloat16": "bf16"}[self.dtype], "sharded" if self.sharded else "1file"]
                        + (["padded"] if self.padded_rows else []) + ([f"pad{self.pad_to}"] if self.pad_to else [])
                        + ([self.new_ids] if self.new_ids else []) + (["trained"] if self.train else []))


# Gemma 3n E2B/E4B's text layout: a per-layer table of 262,144 rows beside 262,400 input rows (ids
# past it are soft tokens), so new terms take reserved <unusedN> ids (new_ids 'auto'); trained, so
# the per-layer rows train too. The multimodal class's vision tower is a timm model: its case runs
# only under tests/vision_libs.py (tests/test_gemma3n_multimodal.py).
GEMMA3N = Case("gemma3", "Gemma3nForCausalLM", tied=True, dtype="float32", sharded=True, train=True)
GEMMA3N_MULTIMODAL = Case("gemma3", "Gemma3nForConditionalGeneration", tied=True, dtype="float32", sharded=True,
                          train=True)
NEEDS_VISION_LIBS = {"Gemma3nForConditionalGeneration"}  # built and run only after tests.vision_libs.enable()
GEMMA3_RESERVED = Case("gemma3", "Gemma3ForCausalLM", tied=True, dtype="float32", sharded=False, new_ids="reserved")

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
    # Embedding layouts beyond one matrix (issue 40). No BLOOM tokenizer is available offline;
    # Falcon's is another byte-level BPE of the same kind.
    Case("falcon", "BloomForCausalLM", tied=True, dtype="bfloat16", sharded=True),
    Case("gpt2", "OPTForCausalLM", tied=True, dtype="float32", sharded=False),  # OPT's own tokenizer is GPT-2's
    Case("gpt-neox", "MambaForCausalLM", tied=True, dtype="bfloat16", sharded=False, train=True),
    # DeepSeek Coder's real layout: 32,256 rows (a multiple of 128) for its tokenizer
    Case("deepseek-coder", "LlamaForCausalLM", tied=False, dtype="float32", sharded=False, pad_to=128),
    Case("gemma3", "Gemma3ForConditionalGeneration", tied=True, dtype="float32", sharded=False),
    Case("qwen2", "Qwen2VLForConditionalGeneration", tied=False, dtype="float32", sharded=False),
    Case("llama2-spm", "LlavaForConditionalGeneration", tied=False, dtype="bfloat16", sharded=True, train=True),
    GEMMA3N,
    GEMMA3N_MULTIMODAL,
    # --new-ids reserved on the two tokenizers that reserve unused tokens: the embedding keeps its size
    GEMMA3_RESERVED,
    Case("llama3-original", "LlamaForCausalLM", tied=False, dtype="float32", sharded=False, new_ids="reserved",
         train=True),
]
# The cases whose own test files run their job through every check of `check_published`, beside
# their layout's own tests (tests/test_gemma3n.py, tests/test_new_ids_reserved.py,
# tests/test_gemma3n_multimodal.py): the matrix leaves them out, as a second job on a 262k-token
# tokenizer would repeat one of those (and Gemma 3n's multimodal case needs tests/vision_libs.py).
CHECKED_ELSEWHERE = (GEMMA3N, GEMMA3_RESERVED, GEMMA3N_MULTIMODAL)
assert len({case.id for case in CASES}) == len(CASES), "case ids name their work and cache folders"
MATRIX_CASES = [case for case in CASES if case not in CHECKED_ELSEWHERE]
TERMS = ["ciprofloxacin", "immunohistochemistry", "SARS-CoV-2", "免疫组化", "naïveté"]
TERMS_PARAGRAPH = ("Immunohistochemistry of the biopsy was negative for SARS-CoV-2, so ciprofloxacin was started; "
                   "with some naïveté the team repeated the immunohistochemistry (免疫组化) a week later.")


def build_checkpoint(case: Case, folder: Path, model_sources=None) -> Path:
    """The case's base model folder: its family's tokenizer and a tiny random model of its
    architecture, saved in its dtype, tied or untied, one file or 3+ shards."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer_dir = family_tokenizer_dir(case.family, model_sources)
    if case.architecture in MULTIMODAL or case.architecture in BUILT_APART:
        family, build = {**MULTIMODAL, **BUILT_APART}[case.architecture]
        assert family == case.family and not case.padded_rows and not case.pad_to, case
        build(folder, tokenizer_dir, dtype=case.dtype, sharded=case.sharded)
        return folder
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model_type, options = ARCHITECTURES[case.architecture]
    special = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    rows = tokenizer_ids_end(tokenizer) + case.padded_rows
    if case.pad_to:
        rows = math.ceil(rows / case.pad_to) * case.pad_to
    settings = {**SHAPE, **{k: v for k, v in special.items() if v is not None}, **options}
    config = AutoConfig.for_model(model_type, vocab_size=rows, tie_word_embeddings=case.tied,
                                  **{k: v for k, v in settings.items() if v != OMIT})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(getattr(torch, case.dtype))
    assert type(model).__name__ == case.architecture
    # Tiny layers, so a tiny limit: 3+ shards even where the embedding takes one of its own.
    model.save_pretrained(folder, max_shard_size="16KB" if case.sharded else "10GB")
    tokenizer.save_pretrained(folder)
    return folder


def gemma3n_text_options(tokenizer) -> dict:
    """Gemma 3n's text config with the real per-layer ratio: 262,400 input rows, a per-layer table
    of the first 262,144 (ids past it are the soft tokens, which read row 0), 4 per-layer values
    per layer, 4 AltUp inputs."""
    return dict(vocab_size=262400, vocab_size_per_layer_input=262144, hidden_size=32, hidden_size_per_layer_input=4,
                num_hidden_layers=2, intermediate_size=[64, 64], num_attention_heads=2, num_key_value_heads=1,
                head_dim=16, layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0, laurel_rank=4,
                altup_num_inputs=4, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)


def open_altup(layers) -> None:
    """transformers initialises AltUp's correct_output_scale to zeros, which multiplies the
    per-layer path by 0 (no per-layer row would matter, none would get a gradient); a trained
    Gemma 3n's is not."""
    import torch

    with torch.no_grad():
        for layer in layers:
            layer.altup.correct_output_scale.fill_(1.0)


def build_gemma3n_text(folder: Path, tokenizer_dir: Path, *, dtype: str = "float32", sharded: bool = False) -> Path:
    """Gemma 3n's text model (Gemma3nForCausalLM) with the real Gemma tokenizer (gemma3n_text_options)."""
    import torch
    from transformers import AutoTokenizer, Gemma3nForCausalLM, Gemma3nTextConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    model = Gemma3nForCausalLM(Gemma3nTextConfig(**gemma3n_text_options(tokenizer)))
    open_altup(model.model.layers)
    # Tiny layers, so a tiny limit: 3+ shards even where the embedding takes one of its own.
    model.to(getattr(torch, dtype)).save_pretrained(folder, max_shard_size="16KB" if sharded else "10GB")
    tokenizer.save_pretrained(folder)
    return folder


# class name -> (the family whose tokenizer it carries, its builder): text models whose config the
# shared tiny shape cannot describe
BUILT_APART = {"Gemma3nForCausalLM": ("gemma3", build_gemma3n_text)}


def base_checkpoint(case: Case, model_sources=None) -> Path:
    """The case's base model folder, built once per machine (keyed by the contents of the files
    that build it, so a change to how cases are built builds them again)."""
    import hashlib

    from tests import multimodal_models
    from tests.family_tokenizers import built_once

    builders = Path(__file__).read_bytes() + Path(multimodal_models.__file__).read_bytes()
    digest = hashlib.sha256(builders).hexdigest()[:12]
    return built_once(MACHINE_CACHE / "models" / digest / case.id, "config.json",
                      lambda staging: build_checkpoint(case, staging, model_sources))


def corpus_text() -> str:
    """A small real corpus for the cases that train: FOLDOC entries (any real text works; the
    weights are random), with a paragraph that uses every term after every 20th entry. FOLDOC
    holds none of the terms, and an untied model's input row gets a gradient only where its token
    occurs: without them, "trained" input rows would never move."""
    import gzip

    with gzip.open("/usr/share/dictd/foldoc.dict.dz", "rt", encoding="utf-8", errors="replace") as handle:
        text = handle.read(400_000)
    blocks = [block for block in (" ".join(block.split()) for block in text.split("\n\n")) if len(block) > 80]
    for at in range(len(blocks) - len(blocks) % 20, 0, -20):
        blocks.insert(at, TERMS_PARAGRAPH)
    return "\n\n".join(blocks)


def work_folder(out: Path) -> Path:
    """Where a trained case's job keeps its work folder (its initial rows among them), beside `out`."""
    return out.with_name(out.name + "-work")


def extend_args(case: Case, base: Path, out: Path, terms_file: Path, corpus_file: Path) -> list[str]:
    """`tide extend` arguments for a case: init only, or 2 training steps on the corpus with every term kept."""
    args = ["extend", "--base-model", str(base), "--terms", str(terms_file), "--eval-bytes", "1000", "--out", str(out)]
    if case.train:
        args += ["--corpus", str(corpus_file), "--steps", "2", "--batch-size", "2", "--seq-len", "64", "--keep-all-terms",
                 "--work-dir", str(work_folder(out))]
    else:
        args += ["--steps", "0"]
    return args + (["--new-ids", case.new_ids] if case.new_ids else [])


def extend_case(case: Case, base: Path, out: Path) -> None:
    """The case's job through `tide extend` (the matrix's arguments), inputs written beside `out`.
    Fewer and shorter contexts than the benchmark's: writing them is most of an untrained case's
    time, and no check depends on their number or length."""
    from app.cli import main

    terms_file, corpus_file = out.with_name("terms.txt"), out.with_name("corpus.txt")
    terms_file.write_text("\n".join(TERMS) + "\n", encoding="utf-8")
    corpus_file.write_text(corpus_text(), encoding="utf-8")
    assert main([*extend_args(case, base, out, terms_file, corpus_file), "--term-contexts", "2", "--term-context-tokens", "16"]) == 0


def assert_every_check_passes(case: Case, base: Path, out: Path) -> None:
    """Every check of `check_published` holds on the case's folder, its trained rows moved where
    it trained, a processor loads where one can be built here (Qwen2-VL's needs torchvision), and
    every term was either added or reported skipped."""
    import json

    checks = check_published(case, base, out, work_folder(out))
    failed = {check: why for check, why in checks.items() if why not in ("", "n/a")}
    assert not failed, failed
    assert (checks["trained_rows"] == "") == case.train
    assert (checks["processor"] == "") == (case.architecture in ("LlavaForConditionalGeneration",
                                                                 "Gemma3ForConditionalGeneration",
                                                                 "Gemma3nForConditionalGeneration"))
    extension = json.loads((out / "tide_extension.json").read_text())
    assert {term["term"] for term in extension["terms"]} | {s["term"] for s in extension["skipped"]} == set(TERMS)
