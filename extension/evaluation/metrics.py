"""Before/after metrics of an extension: bits per byte, tokens per byte, new-token usage, on the
held-out domain text and on general English (extension/evaluation/scoring.py says how text is scored)."""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

from ..plan.options import DEFAULTS
from .general_text import GeneralText, load_general_text
from .scoring import DEFAULT_CHUNK_BYTES, chunk_documents, context_token_id, document_cap, score_documents

def evaluate_model(
    model,
    tokenizer,
    domain_docs: Iterable[str] | None,
    general_text: GeneralText | str | Sequence[str] | None,
    *,
    new_token_ids: Iterable[int] | None = None,
    max_bytes: int | None = DEFAULTS["eval_max_bytes"],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    general_max_bytes: int | None = None,
    batch_tokens: int | None = None,
    context_id: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    score_cache=None,
) -> dict:
    """Score held-out domain documents and general text with one model + tokenizer.

    `on_progress(done, total)` hears how many of the chunks (domain and general together) are
    scored, batch by batch: on a CPU a 135M model takes tens of seconds for the default budget.
    `batch_tokens` (tokens per forward) defaults to the device's (devices.eval_batch_tokens);
    `score_cache` keeps and reuses the scores of a model scored without `new_token_ids`.

    `domain_docs` None or empty (a terms-only job) gives `"domain": None`; likewise for
    `general_text`. `general_max_bytes` defaults to `max_bytes`. The result is JSON-ready:

        {"domain": {bits_per_byte, tokens_per_byte, bits_per_token, bytes, tokens, documents,
                    chunks, new_tokens, new_token_usage, distinct_new_tokens_used} | None,
         "general": {same keys, plus "source"} | None,
         "settings": {chunk_bytes, max_bytes, general_max_bytes, context_token_id, context_token,
                      dtype},
         "seconds": float}
    """
    started = time.perf_counter()
    new_ids = None if new_token_ids is None else sorted(set(int(i) for i in new_token_ids))
    context = context_token_id(tokenizer) if context_id is None else context_id
    if isinstance(general_text, str):
        general_text = GeneralText([general_text], "text")
    elif general_text is not None and not isinstance(general_text, GeneralText):
        general_text = GeneralText(list(general_text), "documents")
    general_limit = max_bytes if general_max_bytes is None else general_max_bytes
    on_scored = None
    domain_docs = list(domain_docs or [])
    # the user's held-out documents span as many as the budget allows (document_cap); the general
    # text is one fixed reference, read from its start
    domain_cap = document_cap([len(doc.encode("utf-8")) for doc in domain_docs], max_bytes, chunk_bytes)
    if on_progress is not None:
        total = sum(len(doc) for doc in chunk_documents(domain_docs, chunk_bytes, max_bytes, domain_cap))
        if general_text is not None:
            total += sum(len(doc) for doc in chunk_documents(general_text.documents, chunk_bytes, general_limit))
        done = 0

        def on_scored(count: int) -> None:
            nonlocal done
            done += count
            on_progress(done, total)

        on_progress(0, total)
    common = dict(new_token_ids=new_ids, chunk_bytes=chunk_bytes, batch_tokens=batch_tokens, context_id=context,
                  on_scored=on_scored, score_cache=score_cache)
    domain = score_documents(model, tokenizer, domain_docs, max_bytes=max_bytes, document_bytes=domain_cap, **common)
    general = None
    if general_text is not None:
        general = score_documents(model, tokenizer, general_text.documents, max_bytes=general_limit, **common)
        if general is not None:
            general["source"] = general_text.source
    return {
        "domain": domain,
        "general": general,
        "settings": {
            "chunk_bytes": chunk_bytes,
            "max_bytes": max_bytes,
            "document_bytes": domain_cap,
            "general_max_bytes": general_limit,
            "context_token_id": context,
            "context_token": tokenizer.convert_ids_to_tokens(context),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        },
        "seconds": round(time.perf_counter() - started, 3),
    }


# ---------------------------------------------------------------------------------------------
# Before / after

COMPARED = (
    ("domain", "bits_per_byte"),
    ("domain", "tokens_per_byte"),
    ("general", "bits_per_byte"),
    ("general", "tokens_per_byte"),
    # terms-only jobs: the held-out contexts the base model wrote (evaluation.stage._held_out_contexts)
    ("held_out_contexts", "bits_per_byte"),
    ("held_out_contexts", "tokens_per_byte"),
)


def compare(before: dict, after: dict) -> dict:
    """Deltas and ratios of after vs before, keyed "<section>_<metric>" (e.g.
    "domain_bits_per_byte": {before, after, delta, ratio}); metrics missing on either side are
    left out. Also "domain_new_token_usage" (after only; the base has no new tokens)."""
    result: dict[str, dict] = {}
    for section, metric in COMPARED:
        old = (before.get(section) or {}).get(metric)
        new = (after.get(section) or {}).get(metric)
        if old is None or new is None:
            continue
        result[f"{section}_{metric}"] = {
            "before": old,
            "after": new,
            "delta": new - old,
            "ratio": new / old if old else None,
        }
    usage = (after.get("domain") or {}).get("new_token_usage")
    if usage is not None:
        result["domain_new_token_usage"] = {"after": usage}
    return result


_LABELS = {
    "domain_bits_per_byte": "Domain bits per byte (lower is better)",
    "domain_tokens_per_byte": "Domain tokens per byte (lower is shorter)",
    "general_bits_per_byte": "General-English bits per byte (retention)",
    "general_tokens_per_byte": "General-English tokens per byte",
    "held_out_contexts_bits_per_byte": "Held-out contexts bits per byte (terms-only; lower is better)",
    "held_out_contexts_tokens_per_byte": "Held-out contexts tokens per byte (lower is shorter)",
}


def metrics_table(before: dict, after: dict) -> str:
    """A small markdown table of the before/after metrics, for the model card."""
    change = compare(before, after)
    lines = ["| metric | base model | extended model | change |", "| --- | ---: | ---: | ---: |"]
    for key, label in _LABELS.items():
        if key not in change:
            continue
        row = change[key]
        percent = "" if row["ratio"] is None else f"{(row['ratio'] - 1) * 100:+.2f}%"
        lines.append(f"| {label} | {row['before']:.4f} | {row['after']:.4f} | {percent} |")
    if "domain_new_token_usage" in change:
        domain = after["domain"]
        lines.append(
            f"| Share of domain tokens that are new tokens | 0 | "
            f"{change['domain_new_token_usage']['after'] * 100:.2f}% | "
            f"{domain['distinct_new_tokens_used']} distinct |"
        )
    notes = []
    if after.get("domain"):
        notes.append(f"domain: {after['domain']['bytes']:,} bytes of held-out text")
    if after.get("held_out_contexts"):
        notes.append(f"held-out contexts: {after['held_out_contexts']['bytes']:,} bytes the base model wrote for the terms")
    if after.get("general"):
        notes.append(f"general: {after['general']['bytes']:,} bytes of {after['general']['source']}")
    settings = after.get("settings") or {}
    if settings:
        notes.append(
            f"scored in chunks of {settings['chunk_bytes']} bytes, each after "
            f"`{settings['context_token']}`"
        )
    if notes:
        lines.append("")
        lines.append("Measured on " + "; ".join(notes) + ".")
    return "\n".join(lines) + "\n"
