"""The tokenizer invariants on the real SmolLM2 (byte-level BPE) and Gemma 3 (SentencePiece-style
BPE with byte fallback, no pre-tokenizer split) tokenizers, checked on the saved and reloaded
result, with the shipped example terms plus terms that exercise the fallbacks."""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

import pytest

from extension.tokenizer import (
    LLAMA_CPP_PROBE_TEXT,
    SPACE_CONTEXTS,
    START_CONTEXTS,
    extend_tokenizer,
    read_terms_file,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")
FORTUNES_ES = Path("/usr/share/games/fortunes/es")
FORTUNES_ZH = Path("/usr/share/games/fortunes/chinese")
# Hyphenated and multi-word terms, Spanish and Chinese ones, and one with symbols.
EXTRA_TERMS = ["client-server", "machine learning", "C++", "programación", "计算机科学", "Usenet"]


def _mixed_text(foldoc_chars: int, other_chars: int) -> str:
    with gzip.open(FOLDOC, "rt", encoding="utf-8") as handle:
        foldoc = handle.read(foldoc_chars)
    spanish = "".join(p.read_text(encoding="utf-8") for p in sorted(FORTUNES_ES.glob("*.fortunes")))
    chinese = FORTUNES_ZH.read_text(encoding="utf-8")  # ANSI escapes and all: real text is dirty
    return foldoc + spanish[:other_chars] + chinese[:other_chars]


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def real(request, tmp_path_factory):
    from transformers import AutoTokenizer

    base = request.getfixturevalue(f"{request.param}_tokenizer")
    before = hashlib.sha256(base.backend_tokenizer.to_str().encode()).hexdigest()
    terms = read_terms_file(REPO / "examples" / "terms.txt") + EXTRA_TERMS
    extended = extend_tokenizer(base, terms)
    assert hashlib.sha256(base.backend_tokenizer.to_str().encode()).hexdigest() == before, "base tokenizer changed"
    folder = tmp_path_factory.mktemp(request.param)
    extended.tokenizer.save_pretrained(folder)
    reloaded = AutoTokenizer.from_pretrained(folder)
    text = _mixed_text(*((800_000, 200_000) if request.param == "smollm2" else (250_000, 80_000)))
    return request.param, base, extended, reloaded, text


def test_shipped_terms_are_all_added_with_merges(real):
    name, base, extended, _, _ = real
    shipped = read_terms_file(REPO / "examples" / "terms.txt")
    assert 40 <= len(shipped) <= 60
    by_term = {t.term: t for t in extended.terms}
    if name == "smollm2":
        # They were chosen as frequent FOLDOC words that SmolLM2 splits into 2+ pieces.
        assert all(len(base.tokenize(" " + term)) >= 2 for term in shipped)
        assert all(by_term[term].mechanism == "merges" for term in shipped)
        # The duplicate "Usenet" is reported; nothing else is skipped.
        assert [(s.term, s.reason) for s in extended.skipped] == [("Usenet", "duplicate")]
        # Byte-level BPE cannot merge across "-" or " ": those become word-boundary added tokens.
        assert by_term["client-server"].mechanism == by_term["machine learning"].mechanism == "added_token"
    else:
        # Gemma's BPE sees the whole text as one word, so merges can span "-" and " " too.
        # Its 262k vocab already has some of them as one token: those are reported, not added.
        skipped = {s.term: s.reason for s in extended.skipped}
        single = [term for term in shipped if len(base.tokenize(" " + term)) == 1 and len(base.tokenize(term)) == 1]
        assert single and all(skipped[term] == "already_single_token" for term in single)
        merged = [term for term in shipped if term in by_term and by_term[term].mechanism == "merges"]
        assert len(merged) >= len(shipped) - len(single) - 3
        assert by_term["machine learning"].mechanism == by_term["client-server"].mechanism == "merges"
    counts = extended.to_json()["counts"]
    already = sum(1 for skip in extended.skipped if skip.reason == "already_single_token")
    assert counts["terms_added"] == len(extended.terms) >= len(shipped) - already
    assert counts["intermediates"] < counts["forms"] / 2  # intermediates stay few


def test_every_term_is_one_token_in_context_after_reload(real):
    _, _, extended, reloaded, _ = real
    assert reloaded.is_fast and len(reloaded) == extended.vocab_size
    texts, expected = [], []
    for term in extended.terms:
        ids = {**term.forms, **term.existing_forms}
        start_id = ids[term.term]
        space_id = ids.get(" " + term.term, start_id)
        for template in START_CONTEXTS + SPACE_CONTEXTS:
            texts.append(template.format(term.term))
            expected.append((term.term, start_id if template.startswith("{}") else space_id))
    encoded = reloaded(texts, add_special_tokens=False)["input_ids"]
    missing = [(t, text) for (t, token_id), text, ids in zip(expected, texts, encoded) if token_id not in ids]
    assert not missing
    # Both forms are distinct new tokens wherever the tokenizer tells them apart.
    both = [term for term in extended.terms if term.mechanism == "merges" and len(term.forms) == 2]
    assert len(both) >= 20 and all(len(set(term.forms.values())) == 2 for term in both)


def test_decode_encode_round_trip_on_large_mixed_text(real):
    _, _, extended, reloaded, text = real
    ids = reloaded(text, add_special_tokens=False)["input_ids"]
    assert sum(i >= extended.base_vocab_size for i in ids) > 100
    assert reloaded.decode(ids) == text


def test_text_without_new_token_strings_encodes_to_base_ids(real):
    _, base, extended, reloaded, text = real
    strings = re.compile("|".join(re.escape(token.text) for token in extended.new_tokens))
    lines = [line for line in text.split("\n") if line.strip()]
    untouched = [line for line in lines if not strings.search(line)]
    assert len(untouched) > len(lines) / 2
    def ids(tokenizer, texts):
        return [e.ids for e in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]

    assert ids(reloaded, untouched) == ids(base, untouched)
    # Lines that do contain them get shorter overall.
    touched = [line for line in lines if strings.search(line)]
    assert sum(map(len, ids(reloaded, touched))) < sum(map(len, ids(base, touched)))


def test_reload_keeps_special_tokens_chat_template_and_new_vocab(real):
    _, base, extended, reloaded, _ = real
    assert type(reloaded).__name__ == type(base).__name__
    for attribute in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(reloaded, attribute) == getattr(base, attribute)
    assert reloaded.chat_template == base.chat_template
    assert reloaded.encode("hi") == extended.tokenizer.encode("hi")  # BOS handling survives
    vocab = reloaded.get_vocab()
    assert all(vocab[token.token] == token.id for token in extended.new_tokens)
    base_vocab = base.get_vocab()
    assert all(vocab[token] == token_id for token, token_id in base_vocab.items())
    # Fallback terms keep their word-boundary matching through save and reload.
    added = [term for term in extended.terms if term.mechanism == "added_token"]
    assert added
    for term in added:
        token_id = term.forms[term.term]
        assert reloaded.added_tokens_decoder[token_id].single_word
        assert token_id not in reloaded(f"x{term.term}y", add_special_tokens=False)["input_ids"]


def test_probe_text_keeps_its_ids(real):
    _, base, _, reloaded, _ = real
    assert reloaded.encode(LLAMA_CPP_PROBE_TEXT) == base.encode(LLAMA_CPP_PROBE_TEXT)


@pytest.mark.parametrize("real", ["smollm2"], indirect=True)
def test_new_rows_start_from_the_original_pieces(real, smollm2_path):
    # Each new row of the real SmolLM2, initialised by extension.rows.init, is the mean of the base
    # rows of the token's original pieces: the base BPE of a merged string (intermediates, which
    # may end inside a UTF-8 character, included), the base encoding of an added token's text.
    import torch
    from transformers import AutoModelForCausalLM

    from extension.rows.init import apply_rows, subword_mean_rows

    _, base, extended, _, _ = real
    model = AutoModelForCausalLM.from_pretrained(smollm2_path)
    base_rows = model.get_input_embeddings().weight.detach().float().clone()
    apply_rows(model, subword_mean_rows(model, extended.new_tokens, extended.base_vocab_size),
               base_vocab_size=extended.base_vocab_size)
    rows = model.get_input_embeddings().weight.detach().float()
    added = {i for term in extended.terms if term.mechanism == "added_token" for i in term.forms.values()}
    assert added and any(token.kind == "intermediate" for token in extended.new_tokens)
    for token in extended.new_tokens:
        if token.id in added:
            pieces = base(token.text, add_special_tokens=False)["input_ids"]
        else:
            pieces = [piece.id for piece in base.backend_tokenizer.model.tokenize(token.token)]
            assert "".join(base.convert_ids_to_tokens(pieces)) == token.token
        assert len(pieces) >= 2 and pieces == token.base_ids, (token.token, base.convert_ids_to_tokens(pieces))
        assert base.decode(pieces) == token.text
        torch.testing.assert_close(rows[token.id], base_rows[pieces].mean(0), rtol=1e-5, atol=1e-6,
                                   msg=lambda detail: f"row of {token.token!r}: {detail}")
    # Tied: the output head scores new tokens with the same rows.
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
