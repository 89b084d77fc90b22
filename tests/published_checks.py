"""What every published folder of the model-family matrix must satisfy (issues 23, 37 and 40).

`check_published` runs every check on one folder and returns check -> "" where it holds, "n/a"
where it does not apply, else why not. A check that raises reports the exception as its reason,
so one broken layout shows up as a failed check in the benchmark's table instead of ending the run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.family_tokenizers import inp_texts, llama_cpp_pre_tokenizer

CHECKS = ["loads", "processor", "config", "old_ids", "old_rows", "other_weights", "one_token", "same_ids_on_plain_text", "decodes",
          "forward_new_tokens", "old_logits", "adapter_logits", "fused_loss", "trained_rows", "padding", "reserved_ids",
          "layout", "llama_cpp_pre_tokenizer"]
# Text with none of the new token strings: it must encode exactly as the base encodes it.
MIXED_TEXT = (
    "The quick brown fox jumps over 13 lazy dogs; 3.14159 != 2.71828.\n"
    "def area(r):\n\treturn 3.14 * r ** 2  # pi r squared\n\n"
    "东京是日本的首都。  Größe, naïve café — ¿qué tal?   \t  trailing spaces   \n"
    "    indented = {'a': [1, 2, 3]}\r\n<|not a special|> https://example.org/a?b=c#d"
)
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# What a published config may say differently: its vocabulary's size, and the dtype transformers
# writes into sub-configs on saving.
CONFIG_CHANGES = ("vocab_size", "dtype")
# The same weights on the same old ids: only a wider head's matmul blocking may differ. bf16 logits
# carry 8 bits of mantissa, so a rounding step of a logit near 4 is about 0.03.
OLD_LOGITS_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.0625}
# The fused loss and the model's own differ by summation order only (relative; bf16 hidden states
# and head, each logit rounded before the softmax on one side, after on the other).
FUSED_LOSS_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}


def tokenizer_ids_end(tokenizer) -> int:
    """One past the largest id the tokenizer uses (vocabulary and added tokens)."""
    return max(max(tokenizer.get_vocab().values()) + 1, len(tokenizer))


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


def saved_tensors(folder: Path) -> dict:
    """Every tensor of the folder's safetensors files, as written (no loading code in between)."""
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json"}
_BASE_TOKENIZERS: dict[tuple, object] = {}


def _base_tokenizer(base_dir: Path):
    """The base folder's tokenizer, parsed once per tokenizer: the matrix's cases share a few real
    tokenizers, and parsing Gemma's 33 MB tokenizer.json is seconds each time. Keyed by the
    tokenizer files' bytes, so a case that changes them gets its own. The checks only read it."""
    from transformers import AutoTokenizer

    # the config's model type too: without a tokenizer_class, it picks the tokenizer's class
    model_type = json.loads((base_dir / "config.json").read_text()).get("model_type")
    key = (model_type, *((path.name, hashlib.sha1(path.read_bytes()).hexdigest())
                         for path in sorted(base_dir.iterdir()) if path.name in TOKENIZER_FILES))
    if key not in _BASE_TOKENIZERS:
        _BASE_TOKENIZERS[key] = AutoTokenizer.from_pretrained(base_dir)
    return _BASE_TOKENIZERS[key]


class _Folders:
    """The base and published folders, loaded once for every check."""

    def __init__(self, case, base_dir: Path, out_dir: Path, work_dir: Path | None):
        import transformers
        from transformers import AutoTokenizer

        self.case, self.base_dir, self.out_dir, self.work_dir = case, base_dir, out_dir, work_dir
        self.auto = getattr(transformers, case.auto_class)
        self.extension = json.loads((out_dir / "tide_extension.json").read_text())
        self.base_tok = _base_tokenizer(base_dir)
        self.tok = AutoTokenizer.from_pretrained(out_dir)
        self.base = self.auto.from_pretrained(base_dir, dtype="auto").eval()
        self.model = None  # set by the "loads" check
        self.adapted = None
        self.processor = None  # set by the "processor" check
        self.new_ids = [t["id"] for t in self.extension["new_tokens"]]
        # new_ids 'reserved': the reserved tokens the new ones replaced, same ids (their rows and
        # strings change by design; every other old row and string must not)
        self.reserved = self.extension.get("reserved_tokens") or []
        self.taken = sorted(entry["id"] for entry in self.reserved)
        self.with_terms = "In the " + ", ".join(term["term"] for term in self.extension["terms"]) + " study."

    @property
    def base_rows(self) -> int:
        return self.base.get_input_embeddings().weight.shape[0]

    @property
    def rows(self) -> int:
        return self.model.get_input_embeddings().weight.shape[0]

    @property
    def per_layer_rows(self) -> int | None:
        """Rows of the base's per-layer table (Gemma 3n's `embed_tokens_per_layer`), else None."""
        return getattr(self.base.config.get_text_config(), "vocab_size_per_layer_input", None)

    def kept(self, rows: int):
        """[rows] bool: the old rows of a vocab-indexed table with `rows` rows, without the taken reserved ids."""
        import torch

        mask = torch.ones(rows, dtype=torch.bool)
        mask[[i for i in self.taken if i < rows]] = False
        return mask


def _loads(f: _Folders) -> str:
    """The published folder loads with the family's Auto class as the base's class, and the base +
    the PEFT adapter load too."""
    from peft import PeftModel

    f.model = f.auto.from_pretrained(f.out_dir, dtype="auto").eval()
    if type(f.model).__name__ != f.case.architecture:
        return f"{f.case.auto_class} loads it as {type(f.model).__name__}, not {f.case.architecture}"
    try:
        resized = f.auto.from_pretrained(f.base_dir, dtype="auto")
        resized.resize_token_embeddings(f.rows, mean_resizing=False)
        f.adapted = PeftModel.from_pretrained(resized, f.out_dir / "adapter").eval()
    except Exception as exc:  # noqa: BLE001 - the check reports any failure to load
        return f"the adapter does not load: {exc}"[:300]
    return ""


def _processor(f: _Folders) -> str:
    """Where the base has a processor, AutoProcessor loads the published folder as the same class,
    with the published tokenizer, and every processor file (chat templates too) is carried over."""
    from transformers import AutoProcessor

    found = [name for name in PROCESSOR_FILES if (f.base_dir / name).exists()]
    if not found:
        return "n/a"
    dropped = [name for name in PROCESSOR_FILES + CHAT_TEMPLATE_FILES
               if (f.base_dir / name).exists() and not (f.out_dir / name).exists()]
    if dropped:
        return f"not carried over: {dropped}"
    f.processor = AutoProcessor.from_pretrained(f.out_dir)
    expected = json.loads((f.base_dir / found[0]).read_text()).get("processor_class")
    if expected and type(f.processor).__name__ != expected:
        return f"AutoProcessor loads {type(f.processor).__name__}, the base's is {expected}"
    if len(f.processor.tokenizer) != len(f.tok):
        return f"the processor's tokenizer has {len(f.processor.tokenizer)} tokens, the folder's {len(f.tok)}"
    return ""


def _flat(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _config(f: _Folders) -> str:
    """Every setting of the base's config.json is the published one's (image token ids, softcaps,
    logit scales, projections...), but the vocabulary's size."""
    base, published = (_flat(json.loads((folder / "config.json").read_text())) for folder in (f.base_dir, f.out_dir))
    changed = {key: (value, published.get(key, "missing")) for key, value in base.items()
               if key.rsplit(".", 1)[-1] not in CONFIG_CHANGES and published.get(key, "missing") != value}
    return f"changed: {dict(list(changed.items())[:4])}" if changed else ""


def _old_ids(f: _Folders) -> str:
    """No old token moved or went, but the reserved tokens the new ones replaced (reserved_ids checks those)."""
    old, new = f.base_tok.get_vocab(), f.tok.get_vocab()
    replaced = {entry["reserved"] for entry in f.reserved}
    moved = [(s, i, new.get(s)) for s, i in old.items() if new.get(s) != i and s not in replaced]
    owners: dict[int, list[str]] = {}
    for string, token_id in new.items():
        owners.setdefault(token_id, []).append(string)
    shared = [strings for strings in owners.values() if len(strings) > 1]
    specials = [name for name in ("bos_token_id", "eos_token_id", "pad_token_id")
                if getattr(f.model.config, name, None) is not None
                and getattr(f.model.config, name) != getattr(f.base.config, name)]
    return "; ".join(filter(None, [
        f"{len(moved)} old tokens moved, e.g. {moved[:3]}" if moved else "",
        f"ids with two tokens: {shared[:3]}" if shared else "",
        f"config {specials} changed" if specials else ""]))


def _weights(f: _Folders) -> tuple[str, str]:
    """(old_rows, other_weights): read from the files as written. A vocab-indexed table is any
    tensor with one row per base embedding row (input, head, a head bias) or per row of the base's
    per-layer table (Gemma 3n's, fewer rows than the input's): its old rows (but the taken reserved
    ids') must be bit-identical; every other tensor (norms, projections, a vision tower) whole."""
    import torch

    old, new = saved_tensors(f.base_dir), saved_tensors(f.out_dir)
    sizes = {f.base_rows, f.per_layer_rows} - {None}
    tables = [name for name, tensor in old.items() if tensor.dim() and tensor.shape[0] in sizes]

    def same(name):
        rows = old[name].shape[0]
        kept = f.kept(rows)
        return name in new and torch.equal(new[name][:rows][kept], old[name][kept])

    changed = [name for name in tables if not same(name)]
    others = [name for name in old if name not in tables and (name not in new or not torch.equal(new[name], old[name]))]
    added = sorted(set(new) - set(old))
    old_rows = f"old rows changed in {changed}" if changed else ("" if tables else "no vocab-indexed table found")
    other = "; ".join(filter(None, [f"{len(others)} changed or missing, e.g. {others[:3]}" if others else "",
                                    f"new tensors {added[:3]}" if added else ""]))
    return old_rows, other


def _one_token(f: _Folders) -> str:
    split = []
    for term in f.extension["terms"]:
        for text, form in term["forms"].items():
            context = f"{text} is" if not text.startswith(" ") else f"the{text} is"
            if form["id"] not in f.tok(context, add_special_tokens=False).input_ids:
                split.append(f"{context!r}: {f.tok.tokenize(context)}")
    return "; ".join(split[:3])


def _same_ids_on_plain_text(f: _Folders) -> str:
    texts = [MIXED_TEXT] + inp_texts(f.case.family)
    new_strings = [t["text"] for t in f.extension["new_tokens"]]
    plain = [t for t in texts if not any(s.strip() and s.strip() in t for s in new_strings)]
    changed = [t for t in plain
               if f.tok(t, add_special_tokens=False).input_ids != f.base_tok(t, add_special_tokens=False).input_ids]
    return f"{len(changed)} of {len(plain)} texts encode differently, e.g. {changed[0][:60]!r}" if changed else ""


def _decodes(f: _Folders) -> str:
    round_trip = f.tok.decode(f.tok(f.with_terms, add_special_tokens=False).input_ids)
    base_round_trip = f.base_tok.decode(f.base_tok(f.with_terms, add_special_tokens=False).input_ids)
    return "" if round_trip in (f.with_terms, base_round_trip) else f"{f.with_terms!r} decodes as {round_trip!r}"


def _forward_new_tokens(f: _Folders) -> str:
    """Text with the new tokens runs through the published model; a multimodal one gets an image
    before that text, through its own processor."""
    import torch

    from tests.multimodal_models import MULTIMODAL, image_text_inputs

    if f.case.architecture in MULTIMODAL:
        inputs = image_text_inputs(f.model, f.out_dir, f.with_terms, processor=f.processor, tokenizer=f.tok)
    else:
        inputs = {"input_ids": torch.tensor([f.tok(f.with_terms, add_special_tokens=False).input_ids])}
    used = set(f.new_ids) & set(inputs["input_ids"][0].tolist())
    if not used:
        return "the input holds none of the new tokens"
    with torch.no_grad():
        logits = f.model(**inputs).logits
    if logits.shape[-1] <= max(f.new_ids):
        return f"logits over {logits.shape[-1]} ids, new ids up to {max(f.new_ids)}"
    return "" if torch.isfinite(logits).all() else "logits not finite"


def _old_logits(f: _Folders) -> str:
    """On plain text (as the base encodes it) the logits of every old id are the base's."""
    import torch

    inputs = f.base_tok(MIXED_TEXT, return_tensors="pt")
    with torch.no_grad():
        before = f.base(**inputs).logits.float()
        after = f.model(**inputs).logits[..., : before.shape[-1]].float()
    kept = f.kept(before.shape[-1])  # a taken reserved id's logit is the new token's
    difference = (after[..., kept] - before[..., kept]).abs().max().item()
    tolerance = OLD_LOGITS_TOLERANCE[f.case.dtype]
    return "" if difference <= tolerance else f"old-token logits differ by up to {difference:.4g} (tolerance {tolerance})"


def _adapter_logits(f: _Folders) -> str:
    """base + adapter predicts as the merged folder on text with the new tokens (issue 37: an
    untied model's adapter once lacked the head's new rows)."""
    import torch

    if f.adapted is None:
        return "n/a"
    ids = torch.tensor([f.tok(f.with_terms, add_special_tokens=False).input_ids])
    with torch.no_grad():
        difference = (f.adapted(input_ids=ids).logits.float() - f.model(input_ids=ids).logits.float()).abs().max().item()
    return "" if difference == 0 else f"base + adapter logits differ from the merged folder's by {difference:.4g}"


def _fused_loss(f: _Folders) -> str:
    """The loss training computes (extension.rows.adapter: the frozen model's hidden states, the
    head's old rows and the new rows in one fused cross-entropy, with the model's logit transform)
    equals the model's own loss from its logits, on text with the new tokens, the published rows
    in the adapter. A head whose scale or cap training missed would train the rows against logits
    the model never gives."""
    import torch
    import torch.nn.functional as F

    from extension.rows.adapter import IGNORE_INDEX, attach
    from extension.rows.init import NewRows, is_tied
    from extension.rows.per_layer import per_layer_table

    if f.reserved:
        return "n/a"  # new tokens on old ids: no rows to attach past the base's vocabulary
    first, count = min(f.new_ids), len(f.new_ids)
    model = f.model  # attached below and detached again: its own modules and settings come back
    ids = torch.tensor([f.tok(f.with_terms, add_special_tokens=False).input_ids])
    targets = torch.cat([ids[:, 1:], torch.full((1, 1), IGNORE_INDEX)], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    logits[..., first + count:] = float("-inf")  # padding rows: never a target, out of the softmax in training
    own = F.cross_entropy(logits[0], targets[0], ignore_index=IGNORE_INDEX).item()

    def rows(weight):
        return weight[first:first + count].detach().float().clone()

    head = model.get_output_embeddings()
    tied = is_tied(model)
    table = per_layer_table(model)
    new_rows = NewRows(input=rows(model.get_input_embeddings().weight), output=None if tied else rows(head.weight),
                       output_bias=None if tied or getattr(head, "bias", None) is None else head.bias[first:first + count].detach().float(),
                       per_layer=None if table is None else rows(table.weight))
    adapter = attach(model, first, new_rows)
    try:
        with torch.no_grad():
            fused = adapter.loss(adapter.hidden(ids), targets).item()
    finally:
        adapter.detach()
    difference = abs(fused - own) / abs(own)
    tolerance = FUSED_LOSS_TOLERANCE[f.case.dtype]
    return "" if difference <= tolerance else (f"the fused training loss {fused:.5g}, the model's own {own:.5g} "
                                               f"(relative difference {difference:.3g}, tolerance {tolerance})")


def _trained_rows(f: _Folders) -> str:
    """A trained job's published rows differ from the rows its training started from, which the
    job keeps in its work folder (input_distillation.DISTILLED_NAME, the start of every trained
    corpus job): rows that no gradient reached would publish the init under a "trained" label."""
    import torch

    from extension.training.input_distillation import DISTILLED_NAME

    if not f.case.train or f.work_dir is None:
        return "n/a"
    path = Path(f.work_dir) / DISTILLED_NAME
    if not path.exists():
        return f"the work folder holds no initial rows ({DISTILLED_NAME})"
    from extension.rows.per_layer import per_layer_table

    start = torch.load(path, map_location="cpu", weights_only=False)
    counts = []
    pairs = [("input", f.model.get_input_embeddings().weight)]
    if not f.case.tied:
        pairs.append(("output", f.model.get_output_embeddings().weight))
    table = per_layer_table(f.model)
    if table is not None:  # Gemma 3n: the new ids' per-layer rows train with the input rows
        if start.get("per_layer") is None:
            return "the work folder's initial rows hold no per-layer rows"
        pairs.append(("per_layer", table.weight))
    for name, weight in pairs:
        published = weight[f.new_ids].detach()
        changed = int((published != start[name].to(published.dtype)).any(dim=1).sum())
        counts.append((name, changed))
    unchanged = [name for name, changed in counts if changed == 0]
    summary = ", ".join(f"{name} rows changed: {changed} of {len(f.new_ids)}" for name, changed in counts)
    return f"no {' or '.join(unchanged)} row moved from its init ({summary})" if unchanged else ""


def _padding(f: _Folders) -> str:
    """The published rows are a multiple of the base's 128 where the base has it, else of the
    default 64, and the config says so."""
    multiple = 128 if f.base_rows % 128 == 0 else 64
    configured = f.model.config.get_text_config().vocab_size
    problems = [f"{f.rows} rows, not a multiple of {multiple} (base {f.base_rows})" if f.rows % multiple else "",
                f"config vocab_size {configured}, {f.rows} rows" if configured != f.rows else ""]
    return "; ".join(filter(None, problems))


def _reserved_ids(f: _Folders) -> str:
    """A job on reserved ids (new_ids 'reserved', asked for or chosen by 'auto'): the embedding and
    the config keep their sizes, and every new token sits on the id of a reserved token of the base
    tokenizer (Gemma's <unusedN>, Llama 3's <|reserved_special_token_N|>) that the config does not name."""
    from extension.tokenizer.reserved import RESERVED_PATTERN, config_named_ids

    if f.extension["vocab"].get("new_ids") != "reserved":
        return "n/a"
    base_strings = {i: s for s, i in f.base_tok.get_vocab().items()}
    text, base_text = f.model.config.get_text_config(), f.base.config.get_text_config()
    named = config_named_ids(f.base.config)
    not_reserved = [i for i in f.new_ids if not RESERVED_PATTERN.fullmatch(base_strings.get(i, ""))]
    problems = [
        f"{f.rows} rows, the base had {f.base_rows}" if f.rows != f.base_rows else "",
        f"config vocab_size {text.vocab_size}, the base's {base_text.vocab_size}" if text.vocab_size != base_text.vocab_size else "",
        f"new ids not on reserved tokens: {[(i, base_strings.get(i)) for i in not_reserved[:3]]}" if not_reserved else "",
        f"new ids the config names: {sorted(named & set(f.new_ids))}" if named & set(f.new_ids) else "",
        "the reserved tokens taken are not the new tokens' ids" if sorted(f.new_ids) != f.taken else "",
    ]
    return "; ".join(filter(None, problems))


def _layout(f: _Folders) -> str:
    base_layout, layout = safetensors_layout(f.base_dir), safetensors_layout(f.out_dir)
    model = f.model
    tied_now = model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    problems = []
    if layout["dtypes"] != base_layout["dtypes"]:
        problems.append(f"dtypes {sorted(layout['dtypes'])} (base {sorted(base_layout['dtypes'])})")
    if tied_now != f.case.tied or bool(model.config.tie_word_embeddings) != bool(f.base.config.tie_word_embeddings):
        problems.append(f"tied {tied_now} (base {f.case.tied})")
    if base_layout["index"] and not (layout["index"] and layout["files"] > 1 and layout["complete"]):
        problems.append(f"{layout['files']} file(s), index {layout['index']}, complete {layout['complete']}")
    return "; ".join(problems)


def _llama_cpp_pre_tokenizer(f: _Folders) -> str:
    base_pre = llama_cpp_pre_tokenizer(f.base_tok)
    if base_pre is None:
        return "n/a"
    pre = llama_cpp_pre_tokenizer(f.tok)
    return "" if pre == base_pre else f"{pre} (base {base_pre})"


def check_published(case, base_dir: Path, out_dir: Path, work_dir: Path | None = None) -> dict[str, str]:
    """Every check on one published folder of `case` (tests/model_families.Case); `work_dir`: the
    job's work folder, for a trained case's initial rows."""
    f = _Folders(case, base_dir, out_dir, work_dir)
    results: dict[str, str] = {}

    def run(name, check):
        try:
            results[name] = check(f)
        except Exception as exc:  # noqa: BLE001 - a check that cannot run has failed, with the reason
            results[name] = f"{type(exc).__name__}: {exc}"[:300]

    run("loads", _loads)
    if f.model is None:
        return results  # nothing else can be read from a folder that does not load
    run("processor", _processor)
    run("config", _config)
    run("old_ids", _old_ids)
    try:
        results["old_rows"], results["other_weights"] = _weights(f)
    except Exception as exc:  # noqa: BLE001
        results["old_rows"] = results["other_weights"] = f"{type(exc).__name__}: {exc}"[:300]
    for name, check in [("one_token", _one_token), ("same_ids_on_plain_text", _same_ids_on_plain_text),
                        ("decodes", _decodes), ("forward_new_tokens", _forward_new_tokens), ("old_logits", _old_logits),
                        ("adapter_logits", _adapter_logits), ("fused_loss", _fused_loss), ("trained_rows", _trained_rows),
                        ("padding", _padding),
                        ("reserved_ids", _reserved_ids), ("layout", _layout), ("llama_cpp_pre_tokenizer", _llama_cpp_pre_tokenizer)]:
        run(name, check)
    assert list(results) == CHECKS
    return results
