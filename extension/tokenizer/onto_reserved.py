"""New tokens moved onto reserved ids (new_ids 'reserved', issue 40 item 2).

The job extends, initialises, trains and selects on appended ids as every job does: the adapter,
the training loop and selection all read the new rows as the block after the base. Once the terms
are chosen, and before evaluation (so the model evaluated is the model published), each new
vocabulary entry takes the id of one free reserved token (reserved.py): the reserved token leaves
the tokenizer (its added-token entry and its string in the vocabulary), and the new entry's
vocabulary string, or its added token, gets that id. Merges name strings, not ids, so they stand
as they are; a term's added token keeps the flags every added term has (not special, matched as a
word), so it tokenizes in text where the reserved token, special, never did. The rows follow with
rows.init.apply_rows(at_ids=...).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Sequence

from ..errors import UnsupportedTokenizerError
from .reserved import ReservedToken, take_reserved
from .results import ExtendedTokenizer


def onto_reserved(extended: ExtendedTokenizer, free: Sequence[ReservedToken], *, base_model: str) -> ExtendedTokenizer:
    """`extended` with every new token on a reserved id, lowest first, in the new tokens' order
    (so row i of the job's new rows belongs to reserved id i). Refused when too few are free."""
    taken = take_reserved(list(free), len(extended.new_tokens), base_model=base_model,
                          needs=f"the job kept {len(extended.new_tokens)} new vocabulary entries")
    moves = {token.id: reserved for token, reserved in zip(extended.new_tokens, taken)}
    text = reserved_tokenizer_json(extended.tokenizer.backend_tokenizer.to_str(), moves)
    tokenizer = load_without(extended.tokenizer, text, {reserved.content for reserved in taken})
    _check(tokenizer, extended, moves)
    new_tokens = [replace(token, id=moves[token.id].id) for token in extended.new_tokens]
    terms = [replace(term, forms={form: moves[token_id].id for form, token_id in term.forms.items()})
             for term in extended.terms]
    report = [{"id": moves[token.id].id, "reserved": moves[token.id].content, "token": token.token, "term": token.term}
              for token in extended.new_tokens]
    return replace(extended, tokenizer=tokenizer, new_tokens=new_tokens, terms=terms, reserved=report)


def reserved_tokenizer_json(tokenizer_json: str, moves: dict[int, ReservedToken]) -> str:
    """`tokenizer_json` with each appended id in `moves` replaced by its reserved token's id and
    those reserved tokens removed; every other entry where it was."""
    spec = json.loads(tokenizer_json)
    vocab = spec["model"].get("vocab")
    if not isinstance(vocab, dict):
        raise UnsupportedTokenizerError("new tokens can take reserved ids only in a vocabulary that maps strings to "
                                        "ids (BPE, WordPiece); use new_ids 'append'")
    freed = {reserved.id: reserved.content for reserved in moves.values()}
    spec["added_tokens"] = [entry for entry in spec["added_tokens"] if freed.get(entry["id"]) != entry["content"]]
    for token_id, content in freed.items():
        if vocab.get(content) == token_id:
            del vocab[content]
    for entry in spec["added_tokens"]:
        if entry["id"] in moves:
            entry["id"] = moves[entry["id"]].id
    for string, token_id in list(vocab.items()):
        if token_id in moves:
            vocab[string] = moves[token_id].id
    return json.dumps(spec, ensure_ascii=False)


def load_without(tokenizer, tokenizer_json: str, removed: set[str]):
    """tokenizer_json.load_like, minus the removed tokens in the init options: transformers adds
    every token of `added_tokens_decoder` (and the special-token lists) that the file lacks back,
    on a new id past the vocabulary."""
    from .tokenizer_json import load_like

    kwargs = dict(tokenizer.init_kwargs)
    decoder = kwargs.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        kwargs["added_tokens_decoder"] = {i: t for i, t in decoder.items() if str(t) not in removed}
    for key in ("additional_special_tokens", "extra_special_tokens"):
        if isinstance(kwargs.get(key), (list, tuple)):
            kwargs[key] = [t for t in kwargs[key] if str(t) not in removed]
    return load_like(tokenizer, tokenizer_json, kwargs)


def _check(tokenizer, extended: ExtendedTokenizer, moves: dict[int, ReservedToken]) -> None:
    """Refuse a rewritten tokenizer in which a new token is off its reserved id, a taken reserved
    token survived, or an id past the base's is still in use."""
    backend = tokenizer.backend_tokenizer
    wrong = [(token.token, moves[token.id].id, backend.token_to_id(token.token)) for token in extended.new_tokens
             if backend.token_to_id(token.token) != moves[token.id].id]
    kept = [reserved.content for reserved in moves.values() if backend.token_to_id(reserved.content) is not None]
    ids = backend.get_vocab(with_added_tokens=True).values()
    past = [i for i in ids if i >= extended.base_vocab_size]
    if wrong or kept or past:
        problems = [f"new tokens off their reserved ids ({wrong[:3]})" if wrong else "",
                    f"reserved tokens still in the vocabulary ({kept[:3]})" if kept else "",
                    f"ids past the base vocabulary still in use ({sorted(past)[:3]})" if past else ""]
        raise UnsupportedTokenizerError(
            f"moving the new tokens onto reserved ids would not give the tokenizer its intended ids: "
            f"{'; '.join(p for p in problems if p)}; nothing was written. Use new_ids 'append' for this tokenizer")
