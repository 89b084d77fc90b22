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

import re
from dataclasses import dataclass

from ..errors import InvalidOptionError

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


def take_reserved(free: list[ReservedToken], count: int, *, base_model: str) -> list[ReservedToken]:
    """The first `count` free reserved tokens, or a refusal that says how many are free and what to
    do instead (checked before any weights are loaded)."""
    if count <= len(free):
        return free[:count]
    if not free:
        fix = "use --new-ids append (new_ids \"append\") to grow the vocabulary instead"
        raise InvalidOptionError(option="new_ids", problem=(
            f"is 'reserved', but {base_model}'s tokenizer has no free reserved tokens (no <unusedN> or "
            f"<|reserved_special_token_N|> that the config does not already use); {fix}"))
    raise InvalidOptionError(option="new_ids", problem=(
        f"is 'reserved', but the job has {count} new terms and {base_model}'s tokenizer has only {len(free)} "
        f"free reserved tokens ({free[0].content} .. {free[-1].content}); give at most {len(free)} terms "
        f"(--max-new-tokens {len(free)} for a corpus) or use --new-ids append to grow the vocabulary"))
