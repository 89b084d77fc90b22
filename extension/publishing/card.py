"""The model card (README.md of a published checkpoint): what was added, how, and the evidence."""

from __future__ import annotations

from ..evaluation.metrics import metrics_table
from .decisions import decision_sentences, precision_sentence

_SHOWN_TERMS = 40


def model_card(spec, extension: dict, metrics: dict, history: list[dict]) -> str:
    counts = extension.get("counts", {})
    vocab = extension["vocab"]
    terms = extension.get("terms", [])
    reserved = extension.get("reserved_tokens")
    lines = [
        "---",
        "library_name: transformers",
        "tags: [tide, vocabulary-extension]",
        f"base_model: {spec.base_model}",
        "---",
        "",
        f"# {spec.base_model} + {counts.get('terms_added', len(terms))} domain terms (TIDE)",
        "",
        f"The tokenizer of `{spec.base_model}` was extended so each term below is ONE token. "
        + _vocabulary_sentence(extension, counts),
        "",
        _init_sentence(extension.get("init") or {})
        + (f", then only the new rows were trained for {extension['trained_steps']} steps (every base weight is "
           "unchanged)." if extension.get("trained_steps") else "; no training (init only)."),
        *([] if reserved is not None else [
            "Padding rows are set to the mean output row and listed in `generation_config.json` "
            "(`suppress_tokens`); they are never produced by the tokenizer."]),
        "",
        *_reserved_section(reserved),
        *selection_section(extension.get("selection") or {}, metrics),
        "## Before / after",
        "",
        metrics_table(metrics["before"], metrics["after"]),
        "",
        *([scored_in, ""] if (scored_in := precision_sentence(metrics)) else []),
        "Bits per byte compares models across tokenizers: next-token loss summed over the text, "
        "divided by ln 2 and by its UTF-8 bytes. Lower is better.",
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("THIS_FOLDER")',
        'tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER")',
        "```",
        "",
        "`adapter/` holds the same new rows as a PEFT Trainable Tokens adapter "
        + ("(the embedding's; the tied head shares them) " if vocab["tied"] else "(the input embedding's and the output "
           "head's, each their own) ")
        + (f"for the base model resized to {vocab['vocab_size']:,} rows (`model.resize_token_embeddings({vocab['vocab_size']})`, "
           "then `PeftModel.from_pretrained(model, 'THIS_FOLDER/adapter')`)." if reserved is None else
           "for the base model as it is, on the reserved ids the new tokens took (`PeftModel.from_pretrained(model, "
           "'THIS_FOLDER/adapter')`, with this folder's tokenizer)."),
        "",
        f"## Terms ({len(terms)})",
        "",
        "| term | mechanism | forms (id) |",
        "| --- | --- | --- |",
    ]
    for term in terms[:_SHOWN_TERMS]:
        forms = ", ".join(f"`{text!r}` ({form['id']})" for text, form in term.get("forms", {}).items())
        lines.append(f"| {_cell(term['term'])} | {term.get('mechanism', '')} | {_cell(forms)} |")
    if len(terms) > _SHOWN_TERMS:
        lines.append(f"| … {len(terms) - _SHOWN_TERMS} more in `tide_extension.json` | | |")
    lines += ["", "`tide_extension.json` lists every term, form, intermediate token and id; "
              "`metrics.json` every measurement; `manifest.json` the sha256 of every file.", ""]
    return "\n".join(lines)


def _vocabulary_sentence(extension: dict, counts: dict) -> str:
    vocab = extension["vocab"]
    sides = f"{'tied' if vocab['tied'] else 'untied'} input/output embeddings"
    if extension.get("reserved_tokens") is None:
        return (f"Vocabulary: {vocab['base_vocab_size']:,} base entries + {counts.get('new_vocab_entries', '?')} new "
                f"(term forms and intermediate merges), padded to {vocab['vocab_size']:,} rows ({sides}).")
    return (f"The {counts.get('new_vocab_entries', '?')} new vocabulary entries (term forms and intermediate merges) "
            f"took the ids of reserved unused tokens of the base tokenizer (new_ids 'reserved'), so the embedding keeps "
            f"its {vocab['vocab_size']:,} rows ({sides}) and every row but theirs is the base's, bit for bit."
            + (f" Chosen by the job: {vocab['new_ids_reason']}." if vocab.get("new_ids_reason") else ""))


def _reserved_section(reserved: list[dict] | None) -> list[str]:
    """Which reserved tokens the new tokens took: the old token string is gone from the tokenizer."""
    if reserved is None:
        return []
    lines = [f"## Reserved tokens taken ({len(reserved)})", "",
             "Each of these reserved tokens is now the new token beside it (same id; the reserved string no longer "
             "exists in the tokenizer):", "", "| id | was | now |", "| ---: | --- | --- |"]
    lines += [f"| {entry['id']} | `{_cell(entry['reserved'])}` | `{_cell(repr(entry['token']))}` |"
              for entry in reserved[:_SHOWN_TERMS]]
    if len(reserved) > _SHOWN_TERMS:
        lines.append(f"| … | {len(reserved) - _SHOWN_TERMS} more in `tide_extension.json` | |")
    return lines + [""]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def selection_section(selection: dict, metrics: dict | None = None) -> list[str]:
    """What validation decided: the step published, why training stopped, what selection kept and
    gave up (and how to keep more), a terms-only job against the base model, and the terms
    removed, with the measured reason."""
    lines = []
    if "best_step" in selection:
        lines += [f"Validation ({selection['validation']['source']}, {selection['validation']['bytes']:,} bytes) chose "
                  f"the rows of step {selection['best_step']} (step 0 = the initial rows).", ""]
    # selection skipped (too little validation text): decision_sentences says the model was not judged
    # the precision sentence goes under the before/after table it qualifies (model_card)
    for sentence in decision_sentences({**(metrics or {}), "selection": selection}, style="both", precision=False):
        lines += [sentence, ""]
    removed = selection.get("removed") or []
    if removed:
        lines += ["## Removed terms", "",
                  f"{len(removed)} new tokens cost more than they saved on the validation text and were removed "
                  "(net bits over the validation text; positive = harmful):", "",
                  "| term | uses | net bits | reason |", "| --- | ---: | ---: | --- |"]
        lines += [f"| `{entry['term']!r}` | {entry['occurrences']} | {entry['net_bits']:+.1f} | {entry['reason']} |" for entry in removed]
        lines.append("")
    return lines


def _init_sentence(init: dict) -> str:
    start = init.get("starts_from", init.get("method"))
    if start == "composition":
        sentence = ("Each new row started as its original pieces' base rows composed the way the base vocabulary "
                    "composes its own merges (a regression fitted on them)")
    elif start == "subword_mean_norm":
        sentence = ("Each new row started as the mean of the base rows of the term's original pieces, rescaled to "
                    "their mean norm")
    else:
        sentence = "Each new row started as the mean of the base rows of the term's original pieces"
    distilled = init.get("distillation") or {}
    if distilled.get("steps"):
        sentence += (f"; its input side was then distilled on {distilled['contexts']:,} contexts, so that the model reads "
                     "the text after each new token as it reads it after the original pieces")
        if distilled.get("logit_penalty"):
            sentence += ", with each row's logits held where they started"
    return sentence
