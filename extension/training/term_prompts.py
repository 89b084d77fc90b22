"""What a terms-only job asks the base model to continue, per term: prompts in the list's own
writing system, with no words of a language the user did not give.

The base model writes a term's contexts from a prompt, so the prompt decides the language and the
domain of everything the rows learn from. A list says both without any words of ours: its other
terms. Three styles (the option `term_prompts`):

- "list": alternately the term after up to LIST_PREFIX other terms of the same list (chosen by the
  seed, joined the way the list's script writes a list: "a, b, c, term" or "甲、乙、丙、term"), which
  sets the domain and language of what the base model writes, and the term alone at the start of
  the text (Token Distillation's prompt: BOS + the term's original pieces). The other terms only
  condition the writing: the text trained on starts at the term (conditioning_prefix), since a
  list dense in new tokens teaches their head rows to expect them everywhere (measured in
  benchmarks/results/terms_only_foldoc.md: the new tokens' share of probability on text far from
  any of them cost more than the rows saved).
- "term": always the term alone (Token Distillation's own recipe).
- "templates": five English frames ("The {term}", "{term} is", ...), the earlier default, kept so
  benchmarks can run it beside the others; it puts English around a German or Chinese term.
"""

from __future__ import annotations

import random
import unicodedata

import regex

from ..plan.options import BY_NAME

PROMPT_STYLES = BY_NAME["term_prompts"].choices
TEMPLATES = ("{term}", "The {term}", "{term} is", "A note on {term}:", "In practice, {term}")
LIST_PREFIX = 3  # other terms before the term: enough to name a domain, few enough to leave room

# Scripts written without spaces between words: a list there is joined by the ideographic comma
# (CJK) or by a plain space (Thai and its neighbours use spaces between phrases, not words).
_UNSPACED = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}\p{Tibetan}]")
_CJK = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}]")


def writing_system(text: str) -> str:
    """'cjk', 'unspaced' (Thai, Lao, Khmer, Myanmar, Tibetan) or 'spaced': how the text's script
    separates words, from its letters (the first kind found by count wins)."""
    letters = [c for c in text if unicodedata.category(c)[0] == "L"]
    cjk = sum(1 for c in letters if _CJK.match(c))
    unspaced = sum(1 for c in letters if _UNSPACED.match(c)) - cjk
    spaced = len(letters) - cjk - unspaced
    best = max(("cjk", cjk), ("unspaced", unspaced), ("spaced", spaced), key=lambda pair: pair[1])
    return best[0] if best[1] > 0 else "spaced"


def list_separator(terms: list[str]) -> str:
    """How a list of these terms is written: by the writing system most of them use."""
    counts: dict[str, int] = {}
    for term in terms:
        kind = writing_system(term)
        counts[kind] = counts.get(kind, 0) + 1
    kind = max(counts, key=counts.get) if counts else "spaced"
    return {"cjk": "、", "unspaced": " "}.get(kind, ", ")


def term_prompts(terms: list[str], per_term: int, *, style: str = "list", seed: int = 0) -> list[str]:
    """`per_term` prompt texts per term, term by term (the term's k-th context gets the k-th)."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"style must be one of {PROMPT_STYLES}, got {style!r}")
    separator = list_separator(terms)
    prompts: list[str] = []
    for index, term in enumerate(terms):
        others = [other for other in terms if other != term]
        for k in range(per_term):
            if style == "templates":  # as the earlier default wrote them: one frame per term
                prompts.append(TEMPLATES[index % len(TEMPLATES)].format(term=term))
            elif style == "term" or k % 2 == 1 or not others:
                prompts.append(term)
            else:
                chosen = random.Random(f"{seed}:{index}:{k}").sample(others, min(LIST_PREFIX, len(others)))
                prompts.append(separator.join([*chosen, term]))
    return prompts


def conditioning_prefix(prompt: str, term: str, style: str) -> str | None:
    """The part of a "list" prompt before its term (the other terms and the separator after them,
    its trailing space dropped so the term keeps its in-text form, " term"), which a context drops
    once written; None where the whole prompt is kept."""
    if style != "list" or prompt == term or not prompt.endswith(term):
        return None
    return prompt[: -len(term)].rstrip()
