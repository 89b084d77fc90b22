"""Corpus miner: real tokenizers (SmolLM2, Gemma 3) on real text read from Debian packages."""

from __future__ import annotations

import gzip
import json
import re
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

from extension.plan.corpus import is_held_out, iter_documents, split_of
from extension.errors import InvalidCorpusError, InvalidOptionError
from extension.mining import MiningFilters, continue_bpe, mine_terms
from extension.mining.filters import ANSI_ESCAPE
from extension.mining.whole_words import join_whole_words

FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")
FORTUNES = Path("/usr/share/games/fortunes")


def _fortune_documents(paths: list[Path]) -> list[str]:
    docs = []
    for path in paths:
        for entry in re.split(r"(?m)^%\s*$", path.read_text(encoding="utf-8")):
            entry = re.sub(r"\n\s*\n", "\n", entry).strip("\n")
            if entry.strip():
                docs.append(entry)
    return docs


def _write_corpus(path: Path, docs: list[str]) -> Path:
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def foldoc_corpus(tmp_path_factory) -> Path:
    """The first ~1 MB of FOLDOC, cut at an entry boundary."""
    with gzip.open(FOLDOC, "rt", encoding="utf-8") as handle:
        text = handle.read(1_000_000)
    text = text[: text.rindex("\n\n")]
    path = tmp_path_factory.mktemp("foldoc") / "foldoc.txt"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def foldoc_mined(smollm2_tokenizer, foldoc_corpus):
    return mine_terms(smollm2_tokenizer, foldoc_corpus, max_new_tokens=300, min_frequency=3)


def _corpus_file(folder: Path, docs: list[str]) -> Path:
    """Documents as a user gives them: one file, blank lines between documents."""
    path = folder / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


# --- the merge loop on its own ------------------------------------------------------------------


NAMES = {0: "a", 1: "b", 2: "c", 3: "d"}


def _pieces(*tokens: str) -> tuple[int, ...]:
    return tuple("abcd".index(t) for t in tokens)


def test_merge_loop_counts_overlaps_and_stops_at_min_count():
    words = [(_pieces("a", "a", "a", "a"), 5), (_pieces("a", "b", "c"), 4), (_pieces("b", "c", "d"), 2)]
    result = continue_bpe(words, NAMES, max_merges=10, min_count=3, reject=lambda *_: None)
    # (a, a) occurs 3 times per word by adjacency but only 2 merges fit in "aaaa": saves 2 x 5.
    assert [(m.left, m.right, m.tokens_saved) for m in result.merges][:2] == [("a", "a", 10), ("b", "c", 6)]
    # then "aa"+"aa" (5) and "a"+"bc" (4); "bc"+"d" occurs only twice: below min_count.
    assert [m.token for m in result.merges] == ["aa", "bc", "aaaa", "abc"]
    assert result.tokens_before - result.tokens_after == sum(m.tokens_saved for m in result.merges)
    assert result.usage == [0, 2, 5, 4]
    assert result.used_by_later_merge == [True, True, False, False]
    assert result.pieces[3] == ["a", "b", "c"]


def test_merge_loop_respects_refusals_and_banned_pairs():
    words = [(_pieces("a", "b"), 9), (_pieces("c", "d"), 8), (_pieces("b", "c"), 7)]
    refuse_cd = lambda left, right, token: "punctuation" if token == "cd" else None  # noqa: E731
    result = continue_bpe(words, NAMES, max_merges=10, min_count=1, reject=refuse_cd, banned_pairs={("a", "b")})
    assert [m.token for m in result.merges] == ["bc"]
    assert result.skipped == Counter({"probe_text": 1, "punctuation": 1})


def test_whole_words_most_saving_first_within_the_budget():
    # Saving: "abcd" 3 x 2 = 6, "abc" 2 x 2 = 4, "cd" 1 x 3 = 3, "bd" 1 x 1 (under min_count).
    # "abcd" needs 3 new strings, over a budget of 2; "abc" fits ("ab" on the way); then it is full.
    words = [(_pieces("a", "b", "c", "d"), 2), (_pieces("a", "b", "c"), 2), (_pieces("c", "d"), 3), (_pieces("b", "d"), 1)]
    result = join_whole_words(words, NAMES, {"a": 0, "b": 1, "c": 2, "d": 3}, max_merges=2, min_count=2,
                              reject=lambda *_: None)
    assert [m.token for m in result.merges] == ["ab", "abc"]
    assert result.skipped == Counter({"over_budget": 1})
    # "abcd" is left as "abc" + "d": both words save two tokens per use
    assert result.tokens_before - result.tokens_after == sum(m.tokens_saved for m in result.merges) == 4 + 4
    assert result.usage == [0, 4] and result.used_by_later_merge == [True, False]
    assert result.pieces[1] == ["a", "b", "c"]
    # with room, the longest saver comes first and "abc" costs nothing more
    roomy = join_whole_words(words, NAMES, {"a": 0, "b": 1, "c": 2, "d": 3}, max_merges=3, min_count=2,
                             reject=lambda *_: None)
    assert [m.token for m in roomy.merges] == ["ab", "abc", "abcd"]


def test_whole_words_never_pass_through_base_strings_or_refused_ones():
    words = [(_pieces("a", "b", "c"), 5), (_pieces("c", "d"), 4), (_pieces("a", "d"), 3)]
    base = {"a": 0, "b": 1, "c": 2, "d": 3, "ab": 9}  # "ab" is a base string no base merge reaches
    refuse_ad = lambda left, right, token: "punctuation" if token == "ad" else None  # noqa: E731
    result = join_whole_words(words, NAMES, base, max_merges=10, min_count=1, reject=refuse_ad, banned_pairs={("c", "d")})
    assert [(m.left, m.right) for m in result.merges] == [("b", "c"), ("a", "bc")]
    assert result.skipped == Counter({"no_plan": 1, "punctuation": 1})


@pytest.mark.parametrize("unit", ["pairs", "words"])
def test_both_mining_units_give_reachable_tokens_and_no_longer_documents(smollm2_tokenizer, foldoc_corpus, unit, tmp_path):
    docs = list(iter_documents(foldoc_corpus))[:3000]
    result = mine_terms(smollm2_tokenizer, _corpus_file(tmp_path, docs), max_new_tokens=120, mining_unit=unit)
    assert result.report["params"]["mining_unit"] == unit and result.report["guarantee"]["passed"]
    assert len(result.terms) == 120
    for term in result.terms:
        assert _ids(result.extended.tokenizer, term.text) == [term.id], term
    if unit == "words":
        # every new token that stands in the text is a whole word of the corpus (an intermediate
        # may stand where a longer word starts with it): the most frequent offers are words
        words = Counter(w for d in docs for w in re.findall(r" ?[A-Za-z]+", d))
        finals = [t for t in result.terms if not any(o.merge[0] == t.token or o.merge[1] == t.token for o in result.terms)]
        assert finals and all(words[t.text] >= 3 for t in finals), [t.text for t in finals if words[t.text] < 3]


def test_mining_unit_is_checked(smollm2_tokenizer, foldoc_corpus):
    with pytest.raises(InvalidOptionError, match=r"mining_unit must be one of 'pairs', 'words', got 'chars'"):
        mine_terms(smollm2_tokenizer, foldoc_corpus, mining_unit="chars")


# --- filters ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, reason",
    [
        (" compiler".encode(), None),
        ("统".encode()[:2], None),  # first bytes of a CJK character: a step toward it
        ("统".encode()[1:], None),  # its last bytes: the character is unknown, kept
        ("─".encode() + "─".encode()[:2], "punctuation"),  # can only complete to box drawing
        (b" 2023", "digits"),
        (b" ((", "punctuation"),
        (b"\n\n", "punctuation"),
        (b"\x1b[3", "control"),
        (b"://foldoc", "url"),
        (b"www.debian", "url"),
        (b"x" * 65, "too_long"),
    ],
)
def test_filter_reasons(data, reason):
    assert MiningFilters().reject_reason(data) == reason


def test_filters_can_be_switched_off():
    assert MiningFilters(digits=False).reject_reason(b" 2023") is None
    assert MiningFilters(control=False, punctuation=False).reject_reason(b"\x1b[") is None
    assert MiningFilters().clean_segments("see \x1b[33mhttp://foldoc.org/ now\x1b[m") == ["see ", " now"]
    assert MiningFilters(urls=False, control=False).clean_segments("a \x1b[1mb") == ["a \x1b[1mb"]


# --- real SmolLM2 tokenizer on FOLDOC -----------------------------------------------------------


def test_foldoc_terms_are_single_reachable_tokens(smollm2_tokenizer, foldoc_mined):
    result = foldoc_mined
    extended = result.extended
    assert len(result.merges) == len(result.terms) == len(extended.new_tokens) == 300
    assert result.report["new_tokens"] == 300
    vocab = extended.tokenizer.get_vocab()
    for term in result.terms:
        assert term.id == vocab[term.token] and term.id >= len(smollm2_tokenizer)
        assert term.token == term.merge[0] + term.merge[1]
        # reachable: its own text encodes to exactly this one token
        assert _ids(extended.tokenizer, term.text) == [term.id], term
        assert "".join(term.original_pieces) == term.token
        assert _ids(smollm2_tokenizer, term.text) == term.original_ids
    words = {t.text.strip() for t in result.terms if t.kind == "term"}
    assert {"Jargon", "operating", "programming", "Unix"} <= words


def test_foldoc_no_document_longer_and_held_out_shorter(smollm2_tokenizer, foldoc_mined, foldoc_corpus):
    report = foldoc_mined.report
    docs = list(iter_documents(foldoc_corpus))
    assert report["status"] == "ok"
    assert report["guarantee"] == {"documents_checked": len(docs), "documents_longer": 0, "passed": True, "examples": []}
    # recompute the held-out numbers independently of the miner
    held = [d for d in docs if is_held_out(d)]
    assert held == [d for d in iter_documents(foldoc_corpus) if split_of(d) != "train"]
    before = sum(len(_ids(smollm2_tokenizer, d)) for d in held)
    after = sum(len(_ids(foldoc_mined.extended.tokenizer, d)) for d in held)
    size = sum(len(d.encode()) for d in held)
    assert report["held_out"]["tokens_before"] == before and report["held_out"]["tokens_after"] == after
    assert report["held_out"]["tokens_per_byte_after"] == pytest.approx(after / size, abs=1e-6)
    assert after < before * 0.99  # at least 1% fewer tokens on text mining never saw
    assert report["held_out"]["new_tokens_used"] > 100
    assert report["probe_text_unchanged"] is True


def test_simulated_counts_equal_real_encoding(smollm2_tokenizer, foldoc_corpus, tmp_path):
    """With the text filters off the miner sees exactly the encoder's words, so its per-token
    frequencies and total savings must equal what the real extended tokenizer produces."""
    docs = [d for d in iter_documents(foldoc_corpus) if not is_held_out(d)][:4000]
    filters = MiningFilters(urls=False, control=False)
    result = mine_terms(smollm2_tokenizer, _corpus_file(tmp_path, docs), max_new_tokens=120, filters=filters)
    real = Counter()
    for doc in docs:
        real.update(_ids(result.extended.tokenizer, doc))
    assert {t.id: t.frequency for t in result.terms} == {t.id: real[t.id] for t in result.terms}
    train = result.report["train"]
    assert train["tokens_before"] - train["tokens_after"] == result.report["mined_tokens_saved"]
    assert result.report["mined_tokens_saved"] == sum(t.tokens_saved for t in result.terms)


def test_mining_is_deterministic_and_jsonl_matches_text(smollm2_tokenizer, foldoc_corpus, tmp_path):
    docs = list(iter_documents(foldoc_corpus))[:2000]
    text_path = _write_corpus(tmp_path / "slice.txt", docs)
    jsonl_path = tmp_path / "slice.jsonl"
    jsonl_path.write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    first = mine_terms(smollm2_tokenizer, text_path, max_new_tokens=80)
    heard: list[int] = []
    again = mine_terms(smollm2_tokenizer, text_path, max_new_tokens=80, corpus_name="notes.txt", on_progress=heard.append)
    # progress: documents read by both passes (counting, then checking), every 256
    assert heard == list(range(256, 2 * 2000 + 1, 256)) and again.report["source"]["file"] == "notes.txt"
    from_jsonl = mine_terms(smollm2_tokenizer, jsonl_path, max_new_tokens=80, text_field="body")
    assert len(first.merges) == 80
    assert first.merges == again.merges == from_jsonl.merges
    assert [t.to_json() for t in first.terms] == [t.to_json() for t in again.terms]
    assert first.report["held_out"] == from_jsonl.report["held_out"]
    json.dumps(first.to_json())  # serialisable as it is


def test_held_out_documents_are_never_mined(smollm2_tokenizer, tmp_path):
    """A word that occurs only in held-out documents must not shape any merge."""
    docs = []
    for i in range(600):
        base = f"Entry {i}: the compiler rewrites the parser output into bytecode for the runtime."
        doc = base + " Qxzvjq Qxzvjq Qxzvjq" if is_held_out(base + " Qxzvjq Qxzvjq Qxzvjq") else base
        docs.append(doc)
    assert any("Qxzvjq" in d for d in docs)
    result = mine_terms(smollm2_tokenizer, _corpus_file(tmp_path, docs), max_new_tokens=40, min_frequency=2)
    assert result.merges
    assert not [t.text for t in result.terms if re.search(r"[Qxzvjq]{2}", t.text.strip())]
    assert all(is_held_out(d) for d in docs if "Qxzvjq" in d)
    assert result.report["corpus"]["held_out_documents"] >= sum("Qxzvjq" in d for d in docs)


def test_probe_text_pairs_are_never_merged(smollm2_tokenizer, tmp_path):
    from extension.tokenizer import LLAMA_CPP_PROBE_TEXT

    docs = [f"{LLAMA_CPP_PROBE_TEXT} sample {i}" for i in range(60)]
    result = mine_terms(smollm2_tokenizer, _corpus_file(tmp_path, docs), max_new_tokens=50, min_frequency=2)
    assert result.report["skipped_candidates"]["probe_text"] > 0
    assert result.report["probe_text_unchanged"] is True
    assert _ids(result.extended.tokenizer, LLAMA_CPP_PROBE_TEXT) == _ids(smollm2_tokenizer, LLAMA_CPP_PROBE_TEXT)


def test_chinese_fortunes_escape_codes_filtered(smollm2_tokenizer, tmp_path):
    raw = (FORTUNES / "chinese").read_text(encoding="utf-8")
    assert ANSI_ESCAPE.search(raw)
    docs = _fortune_documents([FORTUNES / "chinese"])[:800]
    path = _write_corpus(tmp_path / "zh.txt", docs)
    result = mine_terms(smollm2_tokenizer, path, max_new_tokens=100)
    assert len(result.terms) == 100
    assert result.report["guarantee"]["passed"]
    assert result.report["held_out"]["relative_change"] < -0.05  # sub-character merges pay off
    for term in result.terms:
        assert "\x1b" not in term.text and "[3" not in term.text, term
        whole_chars = re.sub(r"\\x[0-9a-f]{2}", "", term.text)  # cut-off characters show as \xNN
        assert not whole_chars.strip() or any(unicodedata.category(c)[0] in "LM" for c in whole_chars), term
    unfiltered = mine_terms(
        smollm2_tokenizer, path, max_new_tokens=100,
        filters=MiningFilters(control=False, punctuation=False, digits=False),
    )
    assert any("\x1b" in t.text for t in unfiltered.terms)  # the filter is what kept them out


# --- Gemma 3's tokenizer (no word splitting, byte fallback) ---------------------------------------


def test_gemma_tokenizer_on_spanish_fortunes(gemma3_tokenizer, tmp_path):
    paths = sorted(p for p in (FORTUNES / "es").iterdir() if p.is_file() and p.suffix == ".fortunes")
    docs = _fortune_documents(paths)[:1500]
    path = _write_corpus(tmp_path / "es.txt", docs)
    result = mine_terms(gemma3_tokenizer, path, max_new_tokens=60)
    extended = result.extended
    assert len(result.terms) == 60 and result.report["guarantee"]["passed"]
    for term in result.terms:
        assert _ids(extended.tokenizer, term.text) == [term.id], term
        assert term.token.replace("▁", " ") == term.text
    assert " Filósofo" in {t.text for t in result.terms}
    assert result.report["held_out"]["tokens_per_byte_after"] < result.report["held_out"]["tokens_per_byte_before"]


# --- bad input ----------------------------------------------------------------------------------


def test_empty_corpus(smollm2_tokenizer, tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n   \n\n", encoding="utf-8")
    with pytest.raises(InvalidCorpusError, match="empty") as info:
        mine_terms(smollm2_tokenizer, path)
    assert info.value.param == "corpus" and info.value.code == "invalid_corpus"


@pytest.mark.parametrize(
    "content, message",
    [
        (b"good text\n\x00\x01binary", r"binary: NUL byte at byte offset 10"),
        ("caf\u00e9 ok\n".encode() + b"bad \xff byte", r"not UTF-8: invalid byte at byte offset 13"),
    ],
)
def test_binary_or_non_utf8_corpus(smollm2_tokenizer, tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    with pytest.raises(InvalidCorpusError, match=message):
        mine_terms(smollm2_tokenizer, path)


def test_bad_jsonl_lines(smollm2_tokenizer, tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"text": "fine"}\n{"text": oops}\n', encoding="utf-8")
    with pytest.raises(InvalidCorpusError, match=r"line 2 is not valid JSON"):
        mine_terms(smollm2_tokenizer, path)
    path.write_text('{"text": "fine"}\n\n{"body": "no text"}\n', encoding="utf-8")
    with pytest.raises(InvalidCorpusError, match=r"line 3 has no string field 'text'"):
        mine_terms(smollm2_tokenizer, path)


def test_corpus_too_small_is_a_clear_result(smollm2_tokenizer, tmp_path):
    path = _write_corpus(tmp_path / "tiny.txt", ["A single short document about compilers."])
    result = mine_terms(smollm2_tokenizer, path)
    assert result.merges == [] and result.terms == [] and not result.found_terms
    assert result.extended.new_tokens == []
    assert result.report["status"] == "no_terms"
    assert "too small" in result.report["message"] and "min_frequency" in result.report["message"]


@pytest.mark.parametrize("value", [0, -5, 50_001, 2.5, "300", True])
def test_max_new_tokens_out_of_range(smollm2_tokenizer, foldoc_corpus, value):
    with pytest.raises(InvalidOptionError, match=r"max_new_tokens must be an integer from 1 to 50,000") as info:
        mine_terms(smollm2_tokenizer, foldoc_corpus, max_new_tokens=value)
    assert info.value.param == "max_new_tokens"


def test_min_frequency_out_of_range(smollm2_tokenizer, foldoc_corpus):
    with pytest.raises(InvalidOptionError, match=r"min_frequency must be an integer from 1 to 1,000,000, got 0") as info:
        mine_terms(smollm2_tokenizer, foldoc_corpus, min_frequency=0)
    assert info.value.param == "min_frequency"


# --- tide mine ----------------------------------------------------------------------------------


def test_cli_table_and_json(smollm2_path, foldoc_corpus, tmp_path, capsys):
    from app.cli import main

    docs = list(iter_documents(foldoc_corpus))[:1500]
    path = _write_corpus(tmp_path / "small.txt", docs)
    common = ["mine", "--corpus", str(path), "--base-model", str(smollm2_path), "--max-new-tokens", "25"]
    assert main(common + ["--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "no-longer check passed: 0 of 1500 documents" in out
    assert "held-out tokens per byte:" in out and "... 20 more" in out
    assert main(common + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["terms"]) == 25 and data["guarantee"]["passed"]
    assert {"text", "frequency", "tokens_saved", "original_pieces"} <= set(data["terms"][0])
    assert data["params"]["mining_unit"] == "pairs"
    assert main(common + ["--json", "--mining-unit", "words"]) == 0
    words = json.loads(capsys.readouterr().out)
    assert words["params"]["mining_unit"] == "words" and words["guarantee"]["passed"]
    assert main(common + ["--mining-unit", "chars"]) == 2
    assert "--mining-unit must be one of 'pairs', 'words', got 'chars'" in capsys.readouterr().err
    assert main(["mine", "--corpus", str(path), "--base-model", str(smollm2_path), "--max-new-tokens", "0"]) == 2
    assert "error (--max-new-tokens): --max-new-tokens must be an integer from 1 to 50,000, got 0" in capsys.readouterr().err
