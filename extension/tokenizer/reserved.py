"""Reserved token ids that new terms may take over (issue 40 item 2: `--new-ids reserved`).

Gemma's tokenizer reserves 6,242 `<unusedN>` tokens below 262,144 and Llama 3's 251
`<|reserved_special_token_N|>`. Putting new terms on those ids keeps the embedding's size, the
serving configs and tensor-parallel splits as they are, and on Gemma 3n it is the only way a new
token stays text: Gemma3nModel sends every id from `vocab_size_per_layer_input` up to the vision and
audio embedders. An id the config or the processor names (image, audio, begin/end-of-image) is
never free, whatever its string says: the model's own code treats it specially.

Read from tokenizer.json and the config only, so a job asking for more than are free is refused
before any weights are loaded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidOptionError
from .extend import extend_tokenizer

# The families' own spellings; a token is reserved only when the tokenizer marks it special too.
RESERVED_PATTERN = re.compile(r"<unused\d+>|<\|reserved_special_token_\d+\|>|\[unused\d+\]")


@dataclass(frozen=True)
class ReservedToken:
    id: int
    content: str


def config_named_ids(config) -> set[int]:
    """Every token id a config (and its sub-configs: text, vision, audio) names: `*_token_id`,
    `*_token_index`, `*_token_ids`. Such an id has a meaning in the model's own code."""
    named: set[int] = set()
    seen: set[int] = set()

    def visit(holder) -> None:
        if holder is None or id(holder) in seen:
            return
        seen.add(id(holder))
        values = holder.to_dict() if hasattr(holder, "to_dict") else holder if isinstance(holder, dict) else {}
        for key, value in values.items():
            if isinstance(value, dict):
                visit(value)
            elif isinstance(key, str) and key.endswith(("_token_id", "_token_index", "_token_ids")):
                for item in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(item, int) and not isinstance(item, bool):
                        named.add(item)

    visit(config)
    return named


def text_id_limit(config) -> int | None:
    """The first id the model's own forward does not treat as text, where it has one: Gemma 3n
    routes ids >= vocab_size_per_layer_input to its vision/audio embedders."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "vocab_size_per_layer_input", None)
    return int(limit) if limit else None


def free_reserved_tokens(tokenizer_json: dict, config=None, other_named_ids=()) -> list[ReservedToken]:
    """The reserved tokens new terms may take, lowest id first: special added tokens the family
    spells as unused/reserved, minus every id the config or the processor names (`other_named_ids`)
    and every id the model does not route as text."""
    named = config_named_ids(config) if config is not None else set()
    named.update(int(i) for i in other_named_ids)
    limit = text_id_limit(config) if config is not None else None
    free = [ReservedToken(int(token["id"]), token["content"]) for token in tokenizer_json.get("added_tokens", [])
            if token.get("special") and RESERVED_PATTERN.fullmatch(token["content"])
            and int(token["id"]) not in named and (limit is None or int(token["id"]) < limit)]
    return sorted(free, key=lambda token: token.id)


def take_reserved(free: list[ReservedToken], count: int, *, base_model: str, needs: str | None = None,
                  fix: str | None = None) -> list[ReservedToken]:
    """The first `count` free reserved tokens, or a refusal that says how many are free and what to
    do instead (checked before any weights are loaded). `needs` says what the job needs in words
    ("the job needs 12 new vocabulary entries ..."), `fix` how to need fewer."""
    if count <= len(free) and free:
        return free[:count]
    if not free:
        raise InvalidOptionError(option="new_ids", problem=(
            f"is 'reserved', but {base_model}'s tokenizer has no free reserved tokens (no <unusedN> or "
            f"<|reserved_special_token_N|> that the config does not already use); {APPEND_INSTEAD} instead"))
    needs = needs or f"the job has {count} new terms"
    fix = fix or f"give at most {len(free)} terms (--max-new-tokens {len(free)} for a corpus)"
    raise InvalidOptionError(option="new_ids", problem=(
        f"is 'reserved', but {needs} and {base_model}'s tokenizer has only {len(free)} free reserved tokens "
        f"({free[0].content} .. {free[-1].content}); {fix}, or {APPEND_INSTEAD}"))


APPEND_INSTEAD = "use --new-ids append (API: new_ids \"append\") to grow the vocabulary"


def tokenizer_named_ids(tokenizer) -> set[int]:
    """The ids the tokenizer gives a role (bos, eos, pad, ... and named extra special tokens such as
    an image token): a model or a chat template reads them, so they are never free."""
    named: set[int] = set()
    for role in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
        value = getattr(tokenizer, f"{role}_token_id", None)
        if isinstance(value, int) and not isinstance(value, bool):
            named.add(value)
    extra = getattr(tokenizer, "extra_special_tokens", None)
    if isinstance(extra, dict):  # named ones only: a plain list is every reserved token on some tokenizers
        named.update(_ids_of(tokenizer, [str(token) for token in extra.values()]))
    return named


def processor_named_ids(folder, tokenizer) -> set[int]:
    """The ids a model folder's processor and tokenizer configs name (`image_token`, `boi_token`,
    `*_token_id`, ...): the processor inserts those tokens around images and audio."""
    if folder is None or not Path(folder).is_dir():
        return set()
    strings: list[str] = []
    named: set[int] = set()

    def visit(values) -> None:
        for key, value in values.items():
            if isinstance(value, dict):
                visit(value)
            elif isinstance(key, str) and key.endswith("_token") and isinstance(value, str):
                strings.append(value)
            elif isinstance(key, str) and key.endswith(("_token_id", "_token_index")) and isinstance(value, int):
                named.add(value)

    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json", "special_tokens_map.json"):
        path = Path(folder) / name
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            visit(data)
    return named | _ids_of(tokenizer, strings)


def _ids_of(tokenizer, strings: list[str]) -> set[int]:
    backend = tokenizer.backend_tokenizer
    return {token_id for token_id in (backend.token_to_id(s) for s in strings) if token_id is not None}


def check_reserved_job(spec, tokenizer, config, model_folder=None) -> list[ReservedToken] | None:
    """For a job with new_ids 'reserved': the free reserved tokens, once it is known that they are
    enough (None for new_ids 'append'). Reads the tokenizer and config only, so a job that asks for
    more than are free is refused before any weights are loaded. A terms job extends the tokenizer
    here to count its new vocabulary entries (forms and intermediates each take an id); a corpus
    job that mines needs room for every entry it may mine (max_new_tokens)."""
    if getattr(spec, "new_ids", "append") != "reserved":
        return None
    tokenizer_json = json.loads(tokenizer.backend_tokenizer.to_str())
    if not isinstance(tokenizer_json.get("model", {}).get("vocab"), dict):
        raise InvalidOptionError(option="new_ids", problem=(
            f"is 'reserved', but {spec.base_model}'s tokenizer is a {tokenizer_json.get('model', {}).get('type')} model "
            "whose vocabulary is a list, where a reserved token's id cannot be given to another string without moving "
            f"every id after it; {APPEND_INSTEAD}"))
    named = tokenizer_named_ids(tokenizer) | processor_named_ids(model_folder, tokenizer)
    free = free_reserved_tokens(tokenizer_json, config, other_named_ids=named)
    if not free:
        take_reserved(free, 1, base_model=spec.base_model)
    if spec.terms:
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        extended = extend_tokenizer(tokenizer, spec.terms, max_term_chars=spec.max_term_chars,
                                    embedding_rows=getattr(text_config, "vocab_size", None))
        count, terms = len(extended.new_tokens), len(extended.terms)
        per_term = count / max(terms, 1)
        take_reserved(free, count, base_model=spec.base_model, needs=(
            f"its {terms} terms need {count} new vocabulary entries (each form of a term and each intermediate "
            f"merge takes an id: {per_term:.1f} per term here)"),
            fix=f"give fewer terms (about {int(len(free) // max(per_term, 1))} fit)")
    elif spec.corpus_path is not None:
        take_reserved(free, spec.max_new_tokens, base_model=spec.base_model, needs=(
            f"mining may add up to {spec.max_new_tokens} new vocabulary entries (--max-new-tokens, API: "
            "mining.max_new_tokens)"), fix=f"give --max-new-tokens {len(free)} or less")
    return free
