"""Unit tests of extension/tokenizer/ on small tokenizers trained here on FOLDOC text: one per
family we serve (byte-level BPE, Gemma-style SentencePiece BPE with byte fallback, Llama-2-style
Metaspace BPE). Real SmolLM2 / Gemma 3 tokenizers are covered in test_tokenizer_real.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from extension.errors import InvalidOptionError, InvalidTermsError
from extension.tokenizer import (
    LLAMA_CPP_PROBE_TEXT,
    SPACE_CONTEXTS,
    START_CONTEXTS,
    clean_terms,
    extend_tokenizer,
    extend_with_merges,
    probe_text_unchanged,
    read_terms_file,
)

FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")
FORTUNES_ES = Path("/usr/share/games/fortunes/es")
FORTUNES_ZH = Path("/usr/share/games/fortunes/chinese")

# Computing terms the small fixtures split into several pieces; some share a long prefix.
TERMS = ["hexadecimal", "microprocessor", "microprocessors", "nondeterministic", "workstation",
         "Smalltalk", "Smalltalker", "multitasking", "preprocessor", "immunohistochemistry"]


def _foldoc(start: int, size: int) -> str:
    with gzip.open(FOLDOC, "rt", encoding="utf-8") as handle:
        handle.read(start)
        return handle.read(size)


def _fortunes(path: Path, size: int) -> str:
    files = sorted(path.glob("*.fortunes")) if path.is_dir() else [path]
    text = "".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
    return text.replace("\x1b", "")[:size]


@pytest.fixture(scope="module")
def mixed_text() -> str:
    """Computing English, Spanish and Chinese text the fixtures were not trained on."""
    return _foldoc(1_000_000, 120_000) + _fortunes(FORTUNES_ES, 40_000) + _fortunes(FORTUNES_ZH, 30_000)


def _train(kind: str):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    lines = _foldoc(0, 300_000).split("\n")
    if kind == "byte_level":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=["<|endoftext|>"], show_progress=False)
        tok.train_from_iterator(lines, trainer)
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"] + byte_tokens,
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer)
    spec = json.loads(tok.to_str())
    # Byte-fallback pieces are ordinary vocab entries, not added tokens.
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in byte_tokens]
    if kind == "sentencepiece":
        # Gemma 3's layout: spaces become "▁" first, so the split on " " never fires and BPE sees
        # the whole text as one word.
        spec["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
        decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    else:  # Llama-2 as transformers converts it: "▁" is prepended to the text and stands for
        # every space, so a term has a single form "▁term".
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoder
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>"
    )


FAMILIES = ["byte_level", "sentencepiece", "metaspace"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    tokenizer = _train(request.param)
    return request.param, tokenizer, extend_tokenizer(tokenizer, TERMS)


def _form_ids(ext, term):
    found = next(t for t in ext.terms if t.term == term)
    ids = dict(found.forms)
    ids.update(found.existing_forms)
    return found, ids


def _assert_one_token(tokenizer, ext, term):
    found, ids = _form_ids(ext, term)
    start_id = ids[term]
    space_id = ids.get(" " + term, start_id)
    for template in START_CONTEXTS + SPACE_CONTEXTS:
        text = template.format(term)
        expected = start_id if template.startswith("{}") else space_id
        got = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert expected in got, (term, text, tokenizer.convert_ids_to_tokens(got))


# ---------------------------------------------------------------------------------------------
# The three families


def test_every_term_is_one_token_in_every_context(family):
    _, tokenizer, ext = family
    skipped = {s.term for s in ext.skipped}
    assert all(s.reason == "already_single_token" for s in ext.skipped)
    assert [t.term for t in ext.terms] == [t for t in TERMS if t not in skipped]
    for term in TERMS:
        if term not in skipped:
            _assert_one_token(ext.tokenizer, ext, term)


def test_forms_follow_what_the_tokenizer_does(family):
    name, _, ext = family
    found, _ = _form_ids(ext, "hexadecimal")
    tokens = {text: ext.tokenizer.convert_ids_to_tokens(i) for text, i in found.forms.items()}
    if name == "byte_level":
        assert tokens == {"hexadecimal": "hexadecimal", " hexadecimal": "Ġhexadecimal"}
    elif name == "sentencepiece":
        assert tokens == {"hexadecimal": "hexadecimal", " hexadecimal": "▁hexadecimal"}
    else:  # Metaspace puts "▁" before every word: one form serves both places
        assert tokens == {"hexadecimal": "▁hexadecimal"}
    # Merges wherever they can work. SentencePiece-style BPE sees the whole text as one word, and
    # where the base merges already join a term's end with a following "," or "." only an added
    # token can give it a token of its own.
    for term in ext.terms:
        assert term.mechanism == "merges" or (
            name != "byte_level" and "joins it with the text around it" in term.fallback_reason
        ), (term.term, term.fallback_reason)
    assert sum(term.mechanism == "merges" for term in ext.terms) >= len(ext.terms) - 2


def test_new_tokens_are_contiguous_and_start_at_base_means(family):
    _, tokenizer, ext = family
    assert ext.base_vocab_size == len(tokenizer)
    ids = [t.id for t in ext.new_tokens]
    assert ids == list(range(len(tokenizer), len(tokenizer) + len(ids)))
    assert len(ext.tokenizer) == ext.vocab_size == len(tokenizer) + len(ids)
    base_vocab = tokenizer.get_vocab()
    for token in ext.new_tokens:
        assert token.token not in base_vocab
        assert ext.tokenizer.convert_tokens_to_ids(token.token) == token.id
        # base_ids are the base tokenizer's own pieces of the token, which spell its text (an
        # added token's content is its text: " term" where the pieces spell "▁term")
        assert len(token.base_ids) >= 2 and all(i < len(tokenizer) for i in token.base_ids)
        spelled = "".join(tokenizer.convert_ids_to_tokens(token.base_ids))
        assert spelled == token.token or (token.token == token.text and spelled.replace("▁", " ") == token.text)
        assert ext.tokenizer.decode([ext.base_vocab_size - 1, token.id]).endswith(token.text)
        assert token.kind in ("form", "intermediate") and token.term in TERMS
        if token.kind == "intermediate":
            assert token.token in next(t for t in ext.terms if t.term == token.term).intermediates


def test_intermediates_are_recorded_few_and_shared(family):
    _, tokenizer, ext = family
    intermediates = [t for t in ext.new_tokens if t.kind == "intermediate"]
    recorded = [s for term in ext.terms for s in term.intermediates]
    assert sorted(recorded) == sorted(t.token for t in intermediates)
    forms = sum(len(term.forms) for term in ext.terms)
    assert len(ext.new_tokens) == forms + len(intermediates)
    # A term of k base pieces needs k - 2 intermediates per form at most; sharing keeps it lower.
    bound = sum(max(len(pieces) - 2, 0) for term in ext.terms for pieces in term.original_pieces.values())
    assert len(intermediates) <= bound
    assert any(len(p) >= 3 for term in ext.terms for p in term.original_pieces.values())  # the test exercises intermediates
    # "Smalltalker" builds on what "Smalltalk" created: far fewer new strings than on its own.
    alone = extend_tokenizer(tokenizer, ["Smalltalker"])
    together = next(t for t in ext.terms if t.term == "Smalltalker")
    assert together.mechanism == "merges" and not together.intermediates
    assert len(together.forms) < len(alone.new_tokens)


def test_text_without_new_token_strings_keeps_its_ids_and_merges_never_lengthen(family, mixed_text):
    _, tokenizer, ext = family
    strings = [t.text for t in ext.new_tokens]
    lines = [line for line in mixed_text.split("\n") if line.strip()]
    untouched = [line for line in lines if not any(s in line for s in strings)]
    touched = [line for line in lines if any(s in line for s in strings)]
    assert len(untouched) > 1000 and len(touched) > 10
    base = tokenizer(untouched, add_special_tokens=False)["input_ids"]
    new = ext.tokenizer(untouched, add_special_tokens=False)["input_ids"]
    assert new == base
    base = tokenizer(touched, add_special_tokens=False)["input_ids"]
    new = ext.tokenizer(touched, add_special_tokens=False)["input_ids"]
    assert all(len(n) <= len(b) for n, b in zip(new, base))
    assert sum(map(len, new)) < sum(map(len, base))


def test_decode_encode_round_trip_on_mixed_text(family, mixed_text):
    name, tokenizer, ext = family
    ids = ext.tokenizer(mixed_text, add_special_tokens=False)["input_ids"]
    assert any(i >= ext.base_vocab_size for i in ids)
    decoded = ext.tokenizer.decode(ids)
    if name == "metaspace":
        # Llama-2-style decoders drop the space they prepend, so a text that starts with a space
        # comes back without it — with the base tokenizer too.
        assert decoded == tokenizer.decode(tokenizer(mixed_text, add_special_tokens=False)["input_ids"])
        assert decoded == mixed_text[1:]
    else:
        assert decoded == mixed_text


def test_written_tokenizer_json_is_the_base_plus_the_new_entries(family):
    # Everything but the new vocab, merges and added tokens is the base's own tokenizer.json, and
    # those come after the base's, in id order.
    _, tokenizer, ext = family
    base = json.loads(tokenizer.backend_tokenizer.to_str())
    extended = json.loads(ext.tokenizer.backend_tokenizer.to_str())
    base_model, model = base.pop("model"), extended.pop("model")
    added_ids = {i for t in ext.terms if t.mechanism == "added_token" for i in t.forms.values()}
    new_vocab = {t.token: t.id for t in ext.new_tokens if t.id not in added_ids}
    # Added tokens are written into the vocabulary too, at their ids, so none can ever move.
    pinned = {t.token: t.id for t in ext.new_tokens if t.id in added_ids}
    assert new_vocab and list(model["vocab"].items()) == (
        list(base_model["vocab"].items()) + list(new_vocab.items()) + list(pinned.items()))
    assert model["merges"] == base_model["merges"] + [list(pair) for pair in ext.merges]
    base_added, added = base.pop("added_tokens"), extended.pop("added_tokens")
    assert added[: len(base_added)] == base_added
    assert [(t["id"], t["content"], t["single_word"], t["special"]) for t in added[len(base_added):]] == [
        # the bare form only as a whole word; the form after a space wherever its text occurs
        (t.id, t.token, not t.token.startswith(" "), False) for t in ext.new_tokens if t.id in added_ids
    ]
    for key in ("vocab", "merges"):
        del base_model[key], model[key]
    assert model == base_model and extended == base


def test_base_tokenizer_is_not_changed():
    tokenizer = _train("byte_level")
    before = tokenizer.backend_tokenizer.to_str()
    extend_tokenizer(tokenizer, TERMS + ["client-server"])
    assert tokenizer.backend_tokenizer.to_str() == before
    assert len(tokenizer) == 1200


def test_saved_tokenizer_reloads_fast_with_the_same_behaviour(family, tmp_path, mixed_text):
    from transformers import AutoTokenizer

    name, tokenizer, ext = family
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    extended = extend_tokenizer(tokenizer, TERMS[:3])
    extended.tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.is_fast and len(reloaded) == extended.vocab_size
    assert reloaded.get_vocab() == extended.tokenizer.get_vocab()
    sample = mixed_text[:20_000]
    assert reloaded(sample)["input_ids"] == extended.tokenizer(sample)["input_ids"]
    assert reloaded.chat_template == tokenizer.chat_template
    assert reloaded.eos_token == tokenizer.eos_token and reloaded.eos_token_id == tokenizer.eos_token_id


# ---------------------------------------------------------------------------------------------
# Skips, fallbacks and mechanisms (byte-level fixture)


@pytest.fixture(scope="module")
def byte_level():
    return _train("byte_level")


def test_duplicates_and_existing_tokens_are_reported_not_added(byte_level):
    vocab = byte_level.get_vocab()
    existing = next(t[1:] for t in sorted(vocab) if t.startswith("Ġ") and t[1:] in vocab and len(t) > 5
                    and t[1:].isascii() and t[1:].isalpha())
    ext = extend_tokenizer(byte_level, ["hexadecimal", " hexadecimal ", existing, "workstation"])
    assert [t.term for t in ext.terms] == ["hexadecimal", "workstation"]
    reasons = {s.term: s.reason for s in ext.skipped}
    assert reasons == {"hexadecimal": "duplicate", existing: "already_single_token"}
    assert all(s.detail and s.term in s.detail for s in ext.skipped)
    assert ext.to_json()["counts"]["skipped"] == 2


def test_a_term_with_one_form_already_in_vocab_adds_only_the_other(byte_level):
    vocab = byte_level.get_vocab()
    bare_only = next(t for t in sorted(vocab) if t.isascii() and t.isalpha() and len(t) > 4 and "Ġ" + t not in vocab
                     and byte_level.tokenize(t) == [t])
    ext = extend_tokenizer(byte_level, [bare_only])
    term = ext.terms[0]
    assert term.existing_forms == {bare_only: vocab[bare_only]}
    assert list(term.forms) == [" " + bare_only]
    _assert_one_token(ext.tokenizer, ext, bare_only)


def test_terms_merges_cannot_reach_become_word_boundary_added_tokens(byte_level):
    ext = extend_tokenizer(byte_level, ["client-server", "C++", "hexadecimal"])
    by_term = {t.term: t for t in ext.terms}
    assert by_term["hexadecimal"].mechanism == "merges"
    for term in ("client-server", "C++"):
        found = by_term[term]
        assert found.mechanism == "added_token" and "pre-tokenizer splits" in found.fallback_reason
        _assert_one_token(ext.tokenizer, ext, term)
        token_id = found.forms[term]
        # word boundaries: never inside another word
        assert token_id not in ext.tokenizer(f"x{term}y ({term}s)", add_special_tokens=False)["input_ids"]
        assert ext.tokenizer.decode(ext.tokenizer(f"use {term}.")["input_ids"]) == f"use {term}."
    added = ext.tokenizer.backend_tokenizer.get_added_tokens_decoder()
    assert added[by_term["C++"].forms["C++"]].single_word
    assert ext.to_json()["counts"]["terms_by_mechanism"] == {"merges": 1, "added_token": 2}


def test_mechanism_merges_refuses_what_merges_cannot_do(byte_level):
    with pytest.raises(InvalidTermsError) as err:
        extend_tokenizer(byte_level, ["hexadecimal", "client-server"], mechanism="merges")
    assert "client-server" in err.value.message and "mechanism 'auto'" in err.value.message
    assert err.value.param == "terms"
    ext = extend_tokenizer(byte_level, ["hexadecimal"], mechanism="merges")
    assert ext.terms[0].mechanism == "merges"


def test_mechanism_added_tokens(byte_level):
    ext = extend_tokenizer(byte_level, ["hexadecimal", "workstation"], mechanism="added_tokens")
    assert [t.mechanism for t in ext.terms] == ["added_token", "added_token"]
    assert ext.merges == []
    for term in ("hexadecimal", "workstation"):
        _assert_one_token(ext.tokenizer, ext, term)
    with pytest.raises(InvalidOptionError) as err:
        extend_tokenizer(byte_level, ["hexadecimal"], mechanism="magic")
    assert err.value.param == "mechanism" and "auto" in err.value.message


def test_added_token_that_would_corrupt_decoding_is_skipped(byte_level):
    # Byte-level decoders read "é" in an added token as the byte 0xE9: such a term cannot be an
    # added token, and being two words it cannot be merges either.
    ext = extend_tokenizer(byte_level, ["café-crème", "hexadecimal"])
    assert [t.term for t in ext.terms] == ["hexadecimal"]
    assert ext.skipped[0].term == "café-crème" and ext.skipped[0].reason == "unsupported"


def test_terms_never_change_the_probe_text(byte_level):
    # Words of llama.cpp's probe text: merges joining their pieces would fire in the probe, and an
    # added token for them would match there too; either makes GGUF conversion refuse the model.
    words = [w for w in ("tea", "sure", "there", "apple") if len(byte_level.tokenize(" " + w)) > 1]
    assert len(words) >= 2, "the fixture should split probe words"
    ext = extend_tokenizer(byte_level, words + ["hexadecimal"])
    assert probe_text_unchanged(byte_level, ext.tokenizer)
    by_term = {t.term: t for t in ext.terms}
    assert by_term["hexadecimal"].mechanism == "merges"
    skipped = {s.term: s for s in ext.skipped}
    assert any(s.reason == "probe_text" and "llama.cpp" in s.detail for s in skipped.values())
    for word in words:
        if word in by_term:
            _assert_one_token(ext.tokenizer, ext, word)
            assert by_term[word].mechanism == "merges" or "probe text" in by_term[word].fallback_reason
        else:
            assert skipped[word].reason == "probe_text"


def test_to_json_reports_terms_forms_and_counts(byte_level):
    ext = extend_tokenizer(byte_level, ["immunohistochemistry", "C++", "hexadecimal", "hexadecimal"])
    data = json.loads(json.dumps(ext.to_json()))
    counts = data["counts"]
    assert counts["terms_added"] == 3 and counts["skipped"] == 1
    assert counts["new_vocab_entries"] == len(ext.new_tokens) == counts["forms"] + counts["intermediates"]
    # C++ goes in as added tokens, its bare form and its form after a space: two entries, no merge
    assert counts["merges"] == len(ext.merges) >= counts["new_vocab_entries"] - 2
    term = next(t for t in data["terms"] if t["term"] == "immunohistochemistry")
    assert term["mechanism"] == "merges" and set(term["forms"]) == {"immunohistochemistry", " immunohistochemistry"}
    assert term["forms"][" immunohistochemistry"]["token"] == "Ġimmunohistochemistry"
    assert len(term["forms"][" immunohistochemistry"]["original_pieces"]) >= 3
    assert term["intermediates"]
    assert next(t for t in data["terms"] if t["term"] == "C++")["fallback_reason"]


# ---------------------------------------------------------------------------------------------
# The miner's primitive and the probe check


def test_extend_with_merges_appends_and_records(byte_level):
    pieces = byte_level.tokenize(" hexadecimal")
    merges = [(pieces[0], pieces[1])]
    for piece in pieces[2:]:
        merges.append(("".join(p for p in merges[-1]), piece))
    ext = extend_with_merges(byte_level, merges)
    assert ext.merges == merges
    assert [t.token for t in ext.new_tokens] == ["".join(pieces[: i + 2]) for i in range(len(pieces) - 1)]
    assert ext.new_tokens[-1].text == " hexadecimal"
    assert ext.tokenizer.tokenize(" hexadecimal") == ["Ġhexadecimal"]
    assert ext.tokenizer.get_vocab()["Ġhexadecimal"] == len(byte_level) + len(pieces) - 2


def test_extend_with_merges_rejects_bad_merges(byte_level):
    vocab = byte_level.get_vocab()
    with pytest.raises(InvalidOptionError, match="neither a base token"):
        extend_with_merges(byte_level, [("Ġhexa", "zzzz")])
    made = next(t for t in vocab if len(t) == 2 and t[0] in vocab and t[1] in vocab and t.isalpha())
    with pytest.raises(InvalidOptionError, match="already a base token"):
        extend_with_merges(byte_level, [(made[0], made[1])])


def test_a_merge_inside_the_probe_text_changes_its_ids(byte_level):
    # Why the miner and the planner keep clear of the probe's adjacent pieces: a merge of two of
    # them changes the probe's ids, which llama.cpp's converter refuses.
    probe_pieces = byte_level.tokenize(LLAMA_CPP_PROBE_TEXT)
    vocab = byte_level.get_vocab()
    pair = next((a, b) for a, b in zip(probe_pieces, probe_pieces[1:])
                if a.startswith("Ġ") and b.isalpha() and a + b not in vocab)
    hexa = tuple(byte_level.tokenize(" hexadecimal")[:2])
    assert probe_text_unchanged(byte_level, extend_with_merges(byte_level, [hexa]).tokenizer)
    assert not probe_text_unchanged(byte_level, extend_with_merges(byte_level, [hexa, pair]).tokenizer)


# ---------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("terms, needle", [
    (["ok", "   "], "term 2 ('   ') is empty or only whitespace"),
    (["", "ok"], "term 1 ('') is empty"),
    (["tab\there"], "term 1 ('tab\\there') contains the control character U+0009"),
    (["esc\x1b[0m"], "U+001B"),
    (["x" * 65], "is 65 characters, over the limit of 64"),
    ([42], "term 1 is int, not a string"),
    ([], "no terms given"),
])
def test_bad_terms_name_the_term_and_the_fix(terms, needle):
    with pytest.raises(InvalidTermsError) as err:
        clean_terms(terms)
    assert needle in err.value.message
    assert err.value.param == "terms" and err.value.code == "invalid_terms"
    assert any(fix in err.value.message for fix in ("remove", "shorten", "give"))


def test_clean_terms_limit_is_configurable_and_checked():
    assert clean_terms(["x" * 65], max_term_chars=80) == (["x" * 65], [])
    with pytest.raises(InvalidOptionError) as err:
        clean_terms(["ok"], max_term_chars=0)
    assert err.value.param == "max_term_chars"
    # the range is the option table's (1..1024), the one --help states: 1010 is allowed, 1025 is not
    assert clean_terms(["x" * 1005], max_term_chars=1010) == (["x" * 1005], [])
    with pytest.raises(InvalidOptionError, match="1 to 1,024"):
        clean_terms(["ok"], max_term_chars=1025)
    with pytest.raises(InvalidTermsError, match="not one string"):
        clean_terms("hexadecimal")


def test_clean_terms_lists_every_bad_term_once():
    with pytest.raises(InvalidTermsError) as err:
        clean_terms(["good", "", "bad\x07", "good"])
    assert err.value.message.startswith("2 invalid term(s)")


@pytest.mark.parametrize("term, named", [
    ("pay\u200fload", "U+200F RIGHT-TO-LEFT MARK (an invisible format character"),
    ("\u200e", "U+200E LEFT-TO-RIGHT MARK"),
    ("\u3164", "U+3164 HANGUL FILLER (an invisible character"),
    ("\ufe0f", "U+FE0F VARIATION SELECTOR-16"),
    ("\U000e01ef", "U+E01EF VARIATION SELECTOR-256"),
    ("\u180e", "U+180E MONGOLIAN VOWEL SEPARATOR"),
    ("\u034f", "U+034F COMBINING GRAPHEME JOINER"),
    ("a\U000f0000", "U+F0000 (a private-use character"),
    ("line\u2028break", "U+2028 LINE SEPARATOR (a line break)"),
])
def test_invisible_and_non_text_characters_are_refused_by_their_unicode_properties(term, named):
    """Issue 25: decided by category and Default_Ignorable_Code_Point, named by code point and
    Unicode name, in the one function every door (CLI, API, worker) calls."""
    with pytest.raises(InvalidTermsError) as err:
        clean_terms(["kernel", term])
    assert f"term 2 ({term!r}) contains {named}" in err.value.message
    assert err.value.message.endswith("remove it")


def test_visible_text_of_every_script_is_kept():
    terms = ["naïve", "Straße", "東京大学", "имя", "مرحبا", "क्षत्रिय", "C++", "a b", "x²"]
    assert clean_terms(terms) == (terms, [])


def test_a_term_in_two_unicode_spellings_is_one_term_in_nfc():
    composed, decomposed = "caf\u00e9ology", "cafe\u0301ology"
    kept, skipped = clean_terms([composed, "kernel", decomposed])
    assert kept == [composed, "kernel"]
    assert [(s.term, s.reason) for s in skipped] == [(composed, "duplicate")]
    assert "2 Unicode spellings" in skipped[0].detail and "NFC" in skipped[0].detail
    # given only in NFD, it is kept in NFC
    assert clean_terms([decomposed]) == ([composed], [])


def test_read_terms_file(tmp_path):
    path = tmp_path / "terms.txt"
    path.write_bytes("\ufeffhexadecimal\r\n\n  work station  \n\t\nnaïve\n".encode("utf-8"))
    assert read_terms_file(path) == ["hexadecimal", "work station", "naïve"]


@pytest.mark.parametrize("content, needle", [
    (b"ok\ncaf\xe9\n", "is not UTF-8: byte 0xE9 at byte offset 6 (line 2)"),
    (b"ok\n\x00\x01", "NUL byte at byte offset 3 (line 2)"),
    (b"\n  \n", "has no terms"),
    (b"ok\nbell\x07\n", "line 2: term 'bell\\x07' contains the control character U+0007"),
])
def test_read_terms_file_errors_name_file_line_and_fix(tmp_path, content, needle):
    path = tmp_path / "terms.txt"
    path.write_bytes(content)
    with pytest.raises(InvalidTermsError) as err:
        read_terms_file(path)
    assert needle in err.value.message and "terms.txt" in err.value.message
    assert err.value.param == "terms"


def test_read_terms_file_missing(tmp_path):
    with pytest.raises(InvalidTermsError, match="does not exist"):
        read_terms_file(tmp_path / "nope.txt")


def test_non_bpe_tokenizers_get_added_tokens():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=800, special_tokens=["[UNK]"], show_progress=False)
    tok.train_from_iterator(_foldoc(0, 100_000).split("\n"), trainer)
    wordpiece = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    ext = extend_tokenizer(wordpiece, ["hexadecimal", "workstation"])
    assert [(t.mechanism, t.fallback_reason) for t in ext.terms] == [("added_token", "the tokenizer is not BPE")] * 2
    assert ext.merges == [] and [t.id for t in ext.new_tokens] == [len(wordpiece), len(wordpiece) + 1]
    for term in ("hexadecimal", "workstation"):
        _assert_one_token(ext.tokenizer, ext, term)
    with pytest.raises(InvalidOptionError, match="needs a BPE tokenizer"):
        extend_tokenizer(wordpiece, ["hexadecimal"], mechanism="merges")
    with pytest.raises(InvalidOptionError, match="need a BPE tokenizer"):
        extend_with_merges(wordpiece, [("a", "b")])


# ---------------------------------------------------------------------------------------------
# Ids: no old id ever moves (Llama 3 / Qwen keep special tokens after the BPE vocabulary)


def _specials_after_the_vocabulary():
    """A byte-level BPE whose special tokens are added tokens OUTSIDE its vocabulary, after it,
    as Qwen 2's and Llama 3's tokenizer.json have them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_foldoc(0, 200_000).split("\n"), trainers.BpeTrainer(
        vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def test_special_tokens_after_the_vocabulary_keep_their_ids():
    tokenizer = _specials_after_the_vocabulary()
    assert tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=False) == 1000
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [1000, 1001, 1002]
    ext = extend_tokenizer(tokenizer, TERMS)
    old, new = tokenizer.get_vocab(), ext.tokenizer.get_vocab()
    assert {s: new[s] for s in old} == old  # every old token, the special ones included, at its id
    assert len(set(new.values())) == len(new)  # no id has two tokens
    assert [t.id for t in ext.new_tokens] == list(range(1003, 1003 + len(ext.new_tokens)))
    assert ext.tokenizer.eos_token_id == 1000
    chat = "<|im_start|>user\nhexadecimal<|im_end|><|endoftext|>"
    assert ext.tokenizer(chat)["input_ids"][0] == 1001 and ext.tokenizer(chat)["input_ids"][-2:] == [1002, 1000]


def test_new_ids_start_after_the_embedding_rows(byte_level):
    ext = extend_tokenizer(byte_level, TERMS[:3], embedding_rows=len(byte_level) + 50)
    assert ext.base_vocab_size == len(byte_level) + 50
    assert [t.id for t in ext.new_tokens] == list(range(ext.base_vocab_size, ext.base_vocab_size + len(ext.new_tokens)))
    for term in TERMS[:3]:
        _assert_one_token(ext.tokenizer, ext, term)


def test_an_added_token_term_is_one_token_after_a_space_too(byte_level):
    ext = extend_tokenizer(byte_level, ["SARS-CoV-2"])  # the pre-tokenizer splits it: no merges reach it
    found, ids = _form_ids(ext, "SARS-CoV-2")
    assert found.mechanism == "added_token" and set(found.forms) == {"SARS-CoV-2", " SARS-CoV-2"}
    _assert_one_token(ext.tokenizer, ext, "SARS-CoV-2")
    text = "the SARS-CoV-2 virus (SARS-CoV-2)"
    tokens = ext.tokenizer.tokenize(text)
    assert "Ġ" not in tokens and " SARS-CoV-2" in tokens and "SARS-CoV-2" in tokens
    assert ext.tokenizer.decode(ext.tokenizer(text)["input_ids"]) == text


def _unigram():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.decoder = decoders.Metaspace(prepend_scheme="first")
    tok.train_from_iterator(_foldoc(0, 100_000).split("\n"), trainers.UnigramTrainer(
        vocab_size=600, special_tokens=["<unk>"], unk_token="<unk>", show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_a_tokenizer_whose_new_ids_would_move_is_refused_before_any_weights():
    from extension.errors import UnsupportedTokenizerError
    from extension.tokenizer import check_extendable

    unigram = _unigram()
    check_extendable(unigram, embedding_rows=len(unigram))  # added tokens right after it: fine
    ext = extend_tokenizer(unigram, ["hexadecimal"], embedding_rows=len(unigram))
    assert [(t.token, t.id) for t in ext.new_tokens] == [("hexadecimal", len(unigram)), (" hexadecimal", len(unigram) + 1)]
    with pytest.raises(UnsupportedTokenizerError, match=r"Unigram model\).*list whose next id is"):
        check_extendable(unigram, embedding_rows=len(unigram) + 10)
    with pytest.raises(UnsupportedTokenizerError, match="would change token ids"):
        extend_tokenizer(unigram, ["hexadecimal"], embedding_rows=len(unigram) + 10)
    with pytest.raises(UnsupportedTokenizerError, match=f"uses id {len(unigram) - 1} .* only {len(unigram) - 1} embedding rows"):
        check_extendable(unigram, embedding_rows=len(unigram) - 1)
