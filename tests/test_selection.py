"""Issue 11: what a job publishes is chosen on a validation split — the best training step (the
init counted) and, for corpus jobs, only the terms that pay for themselves — and reported on a
test split that no decision saw. Real SmolLM2, real Spanish text (Debian's fortunes-es)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from extension.plan.corpus import HELD_OUT_FRACTION, TEST_FRACTION, split_documents, split_of, train_documents
from extension.publishing.decisions import selection_sentence
from extension.evaluation import read_fortune_file
from extension.rows.init import subword_mean_rows
from extension.selection import ValidationPlan, build_validation, keep_optimizer_rows, select_terms
from extension.selection.plan import MIN_EVAL_TOKENS, STEP_COST_IN_SCORED_TOKENS, VALIDATION_SHARE
from extension.selection.scoring import ChunkScore, TextScore
from extension.selection.terms import (
    Unit, UnitEffect, built_on_units, carry_rows, choose_removals, measure_terms, merges_rebuilder, term_units, terms_rebuilder, token_units,
)
from extension.evaluation import document_cap
from extension.selection.validation import chunks_within
from extension.tokenizer import extend_tokenizer

SPANISH = sorted(Path("/usr/share/games/fortunes/es").glob("*.fortunes"))
ENGLISH = Path("/usr/share/games/fortunes/fortunes")


def _spanish_documents() -> list[str]:
    documents = []
    for path in SPANISH:
        try:
            documents += read_fortune_file(path)
        except UnicodeDecodeError:  # a few files of the package are Latin-1: not needed here
            continue
    return documents


@pytest.fixture(scope="module")
def spanish_corpus(tmp_path_factory) -> Path:
    """About 120 kB of Spanish sayings, documents between blank lines (validation: about 6 kB)."""
    documents, size = [], 0
    for document in _spanish_documents():
        documents.append(document)
        size += len(document.encode())
        if size > 120_000:
            break
    path = tmp_path_factory.mktemp("es") / "es.txt"
    path.write_text("\n\n".join(documents), encoding="utf-8")
    return path


# --- splits ------------------------------------------------------------------------------------


def test_splits_are_stable_disjoint_and_independent_of_order(spanish_corpus, tmp_path):
    documents = [d for d in spanish_corpus.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    by_split = {split: list(split_documents(spanish_corpus, split)) for split in ("train", "validation", "test")}
    assert sum(len(docs) for docs in by_split.values()) == len(documents)
    assert not set(by_split["validation"]) & set(by_split["test"])
    assert not (set(by_split["validation"]) | set(by_split["test"])) & set(train_documents(spanish_corpus))
    # roughly the declared fractions, and a document keeps its split whatever the corpus order
    assert abs(len(by_split["test"]) / len(documents) - TEST_FRACTION) < 0.02
    assert abs(len(by_split["validation"]) / len(documents) - (HELD_OUT_FRACTION - TEST_FRACTION)) < 0.02
    shuffled = documents[:]
    random.Random(1).shuffle(shuffled)
    other = tmp_path / "shuffled.txt"
    other.write_text("\n\n".join(shuffled[: len(shuffled) // 2]), encoding="utf-8")
    assert set(split_documents(other, "validation")) == {d for d in shuffled[: len(shuffled) // 2] if split_of(d) == "validation"}
    assert set(split_documents(other, "validation")) <= set(by_split["validation"])


def test_validation_plan_stays_within_its_share_and_scores_step_zero_and_the_last():
    for steps, batch, seq in [(1, 1, 8), (20, 4, 128), (100, 4, 128), (1000, 16, 512)]:
        plan = ValidationPlan.for_training(steps=steps, batch_size=batch, seq_len=seq, available_tokens=10**9)
        scored = [step for step in range(steps + 1) if plan.due(step)]
        assert scored[0] == 0 and scored[-1] == steps
        budget = VALIDATION_SHARE * STEP_COST_IN_SCORED_TOKENS * steps * batch * seq
        # under the share, except that two scorings of MIN_EVAL_TOKENS are the least a decision needs
        assert len(scored) * plan.tokens_per_eval <= max(budget, 2 * MIN_EVAL_TOKENS) * 1.05, (steps, scored, plan)


def test_step_scoring_reads_whole_chunks_within_its_tokens():
    score = TextScore([ChunkScore(ids=[0] * n, ends=[], nll=torch.zeros(n, dtype=torch.float64)) for n in (300, 300, 300, 50)], 1)
    assert [chunks_within(score, t) for t in (100, 300, 599, 600, 901, 10_000)] == [1, 1, 1, 2, 3, 4]


# --- the moments follow the published rows -------------------------------------------------------


def test_no_validation_document_gives_more_than_its_share(smollm2, smollm2_tokenizer):
    # One long document would otherwise be the whole decision text (the Perl manual's were 16 KB).
    long = "The quick brown fox jumps over the lazy dog. " * 400
    notes = [f"Note number {k}: " + "nothing much happened on that day, again. " * 30 for k in range(10)]
    sizes = [len(d.encode("utf-8")) for d in (long, *notes)]
    validation = build_validation(smollm2, smollm2_tokenizer, [long, *notes], source="test", max_bytes=8_000, min_bytes=0)
    assert document_cap(sizes, 8_000) == 1024  # an eighth of 8,000 bytes is below one chunk, so one chunk
    first, second, *_ = validation.chunks
    assert long.startswith(first) and len(first.encode("utf-8")) <= 1024
    assert notes[0].startswith(second)  # the long document gave one chunk, the next document follows


def test_optimizer_moments_follow_the_kept_rows():
    exp_avg = torch.arange(20.0).view(5, 4)
    state = {"state": {0: {"step": torch.tensor(7.0), "exp_avg": exp_avg, "exp_avg_sq": exp_avg * 2}},
             "param_groups": [{"params": [0], "lr": 1e-3}]}
    kept = keep_optimizer_rows(state, [3, -1, 0], num_old=5)["state"][0]
    assert torch.equal(kept["exp_avg"], torch.stack([exp_avg[3], torch.zeros(4), exp_avg[0]]))
    assert torch.equal(kept["exp_avg_sq"][0], exp_avg[3] * 2) and float(kept["step"]) == 7.0
    assert keep_optimizer_rows(None, [0], num_old=1) is None  # best step 0: no moments yet


# --- a harmful term is removed; the tokenizer stays valid ----------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_path, torch_dtype=torch.float32).eval()


def _frequent_split_words(tokenizer, documents: list[str], count: int) -> list[str]:
    """Words of the train documents that the base tokenizer cuts into 2+ pieces, most tokens saved first."""
    words = Counter(w for d in documents for w in re.findall(r"\b\w{5,}\b", d))
    saved = {w: n * (len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) - 1) for w, n in words.items() if n >= 5}
    return sorted(saved, key=lambda w: -saved[w])[:count]


@pytest.fixture(scope="module")
def spanish_validation(smollm2, smollm2_tokenizer, spanish_corpus):
    """The validation split as a job scores it (3,000 bytes: each scoring of it is most of these tests' time)."""
    return build_validation(smollm2, smollm2_tokenizer, list(split_documents(spanish_corpus, "validation")),
                            source="corpus validation split", max_bytes=3_000)


def test_a_harmful_term_is_removed_and_the_tokenizer_stays_valid(smollm2, smollm2_tokenizer, spanish_corpus,
                                                                 spanish_validation):
    train = list(train_documents(spanish_corpus))
    terms = _frequent_split_words(smollm2_tokenizer, train, 12)
    extended = extend_tokenizer(smollm2_tokenizer, terms)
    rows = subword_mean_rows(smollm2, extended.new_tokens, extended.base_vocab_size)
    # The constructed harm: one term's (tied) row is twice the row of " de", the commonest Spanish
    # word, so the model reads the term as " de" and predicts it wherever " de" could come.
    victim = terms[0]
    ids = [i - extended.base_vocab_size for i in next(t for t in extended.terms if t.term == victim).forms.values()]
    de = smollm2_tokenizer(" de", add_special_tokens=False)["input_ids"]
    assert len(de) == 1
    for k in ids:
        rows.input[k] = 2 * smollm2.get_input_embeddings().weight[de[0]].detach()
    validation = spanish_validation
    units = term_units(extended)
    rebuild = terms_rebuilder(smollm2_tokenizer, max_term_chars=64)
    chosen = select_terms(smollm2, extended, rows, validation, units=units, rebuild=rebuild, pad_to_multiple_of=64)

    # terms are chosen on one half of the chunks and the verdict is taken on the other half
    decide, judge = validation.folds()
    assert decide and judge and not set(decide) & set(judge) and sorted(decide + judge) == list(range(len(validation.chunks)))
    for number, record in enumerate(chosen.rounds, start=1):
        assert record["base_bits_per_byte"] == pytest.approx(validation.base_fold(judge).bits_per_byte)
        assert record["decided_on_base_bits_per_byte"] == pytest.approx(validation.base_fold(decide).bits_per_byte)
        stopped = record["bits_per_byte"] + record["margin_bits_per_byte"] <= record["base_bits_per_byte"]
        assert stopped == (number == len(chosen.rounds) and chosen.extended is not None)

    first_round = {entry["term"]: entry for entry in chosen.removed if entry["round"] == 1}
    assert victim in first_round, chosen.removed
    assert first_round[victim]["net_bits"] > 0 and first_round[victim]["occurrences"] > 0
    assert "bits more than it saves" in first_round[victim]["reason"]

    survivors = [unit for unit in units if unit.name not in first_round]
    assert survivors  # a bad row is charged to its own term, not to every term near it

    # each round records how short its tokens make the whole validation text, so the job can say
    # what the removals gave up (extension/publishing/decisions.py)
    assert all(r["tokens_per_byte"] < r["base_tokens_per_byte"] == validation.base.tokens / validation.bytes for r in chosen.rounds)
    if chosen.extended is not None:
        sentence = selection_sentence({"selection": chosen.to_json()})
        assert f"kept {len(chosen.extended.new_tokens)} of the {len(extended.new_tokens)} new tokens offered" in sentence
        assert "of the saving was given up" in sentence

    # the nets never explain less than the measured change: what the attribution cannot place is
    # shared out per use, so a round that removes every harmful unit closes the whole gap
    measured = measure_terms(smollm2, extended, rows, validation, units=token_units(extended), pad_to_multiple_of=64)
    change = (measured["bits_per_byte"] - validation.base_bits_per_byte()) * validation.bytes
    per_use = measured["unexplained_bits_per_use"]
    assert sum(e["net_bits"] for e in measured["effects"].values()) >= change - 0.05
    for effect in measured["effects"].values():
        assert effect["unexplained_bits"] == pytest.approx(per_use * effect["occurrences"], abs=1e-3)
    for kept in [rebuild(survivors)] + ([chosen.extended] if chosen.extended is not None else []):
        kept_terms = {term.term for term in kept.terms}
        assert victim not in kept_terms
        assert [t.id for t in kept.new_tokens] == list(range(kept.base_vocab_size, kept.base_vocab_size + len(kept.new_tokens)))
        for term in kept.terms:  # every kept term is one token in each of its forms
            for text, token_id in term.forms.items():
                assert kept.tokenizer(text, add_special_tokens=False)["input_ids"] == [token_id]
        # text holding no kept term's string tokenizes exactly as the base, the victim included
        strings = [t.text.strip() for t in kept.new_tokens]
        clean = [d for d in train[:400] + read_fortune_file(ENGLISH)[:200] if not any(s in d for s in strings)]
        assert len(clean) > 100 and any(victim in d for d in clean)
        for document in clean:
            assert kept.tokenizer(document, add_special_tokens=False)["input_ids"] == \
                smollm2_tokenizer(document, add_special_tokens=False)["input_ids"]
        # every kept term's rows are carried over by token string, unchanged; an intermediate the
        # rebuild planned anew (its old one served a removed term too) starts at its subword mean
        carried, index = carry_rows(smollm2, extended, rows, kept)
        means = subword_mean_rows(smollm2, kept.new_tokens, kept.base_vocab_size)
        for k, (token, old) in enumerate(zip(kept.new_tokens, index)):
            if token.kind == "form":
                assert old >= 0 and torch.equal(carried.input[k], rows.input[old])
            elif old < 0:
                assert torch.equal(carried.input[k], means.input[k])


def test_removed_terms_are_offered_back_least_harmful_per_use_first_and_stay_only_where_the_verdict_holds(
        smollm2, smollm2_tokenizer, spanish_corpus, spanish_validation):
    """Issue 26: a round removes every harmful unit at once and can overshoot; once the verdict
    passes, restore_units offers the removed ones back in halving batches, ranked by the harm per
    use measured when they went. A batch stays only where both halves of the validation text
    still read below the base; a refused batch leaves the selection as it was."""
    from extension.selection.terms import Selection, restore_units

    train = list(train_documents(spanish_corpus))
    terms = _frequent_split_words(smollm2_tokenizer, train, 8)
    extended = extend_tokenizer(smollm2_tokenizer, terms)
    rows = subword_mean_rows(smollm2, extended.new_tokens, extended.base_vocab_size)
    victim = terms[0]  # read as twice " de", the commonest word: far above the base wherever it is used
    de = smollm2_tokenizer(" de", add_special_tokens=False)["input_ids"][0]
    for k in (i - extended.base_vocab_size for i in next(t for t in extended.terms if t.term == victim).forms.values()):
        rows.input[k] = 2 * smollm2.get_input_embeddings().weight[de].detach()
    validation = spanish_validation
    units = term_units(extended)
    rebuild = terms_rebuilder(smollm2_tokenizer, max_term_chars=64)
    kept_units = [unit for unit in units if unit.name not in terms[:3]]
    current = rebuild(kept_units)
    current_rows, index = carry_rows(smollm2, extended, rows, current)
    # what a round would have recorded: the victim costs the most per use, terms[1] the least
    per_use = {victim: 900.0, terms[1]: 1.0, terms[2]: 3.0}
    removed = [{"term": name, "round": 1, "reason": "costs", "occurrences": 2, "net_bits": 2 * per_use[name]} for name in terms[:3]]
    removed.append({"term": "never seen", "round": 1, "reason": "never used", "occurrences": 0, "net_bits": -1.0})
    from extension.selection.terms import score_folds

    decide, judge = validation.folds()
    passing = score_folds(smollm2, current, current_rows, validation, 64, decide, judge)[1].bits_per_byte
    chosen = Selection(current, current_rows, index, [dict(entry) for entry in removed],
                       [{"round": 1, "new_tokens": len(extended.new_tokens), "bits_per_byte": passing}])
    before = (chosen.extended, chosen.rows, list(chosen.kept_index))

    restore_units(chosen, smollm2, extended, rows, validation, units=units, kept_units=kept_units, rebuild=rebuild,
                  pad_to_multiple_of=64, tries=3)

    # batches halve (2 of the 3 used units, then 1), the least harmful per use first; never-used units are not offered
    assert [t["offered"] for t in chosen.restores][:2] == [2, 1]
    base_decide, base_judge = validation.base_fold(decide), validation.base_fold(judge)
    back: list[str] = []
    for number, attempt in enumerate(chosen.restores):
        assert attempt["base_bits_per_byte"] == pytest.approx(base_judge.bits_per_byte)
        assert attempt["decided_on_base_bits_per_byte"] == pytest.approx(base_decide.bits_per_byte)
        verdict = (attempt["bits_per_byte"] + attempt["margin_bits_per_byte"] <= attempt["base_bits_per_byte"]
                   and attempt["decided_on_bits_per_byte"] <= attempt["decided_on_base_bits_per_byte"]
                   and attempt["bits_per_byte"] <= passing * (1 + attempt["tolerance"]))
        assert attempt["kept"] == verdict
        if attempt["kept"]:
            back += [terms[1], terms[2]][len(back):len(back) + attempt["offered"]]
    assert victim not in back
    kept_terms = {term.term for term in chosen.extended.terms}
    assert kept_terms == {unit.name for unit in kept_units} | set(back)
    assert {entry["term"] for entry in chosen.removed} == {entry["term"] for entry in removed} - set(back)
    if not back:  # every batch refused: nothing about the selection changed
        assert (chosen.extended, chosen.rows, chosen.kept_index) == before
    # every token of a kept or restored term keeps the row it was trained to, by vocabulary string
    trained = {token.token: k for k, token in enumerate(extended.new_tokens)}
    for k, token in enumerate(chosen.extended.new_tokens):
        if chosen.kept_index[k] >= 0:
            assert chosen.kept_index[k] == trained[token.token]
            assert torch.equal(chosen.rows.input[k], rows.input[trained[token.token]])
    sentence = selection_sentence({"selection": {**chosen.to_json(), "kept": len(chosen.kept_index)}})
    assert ("brought back" in sentence) == bool(back)


def test_the_selection_sentence_counts_the_terms_brought_back():
    rounds = [{"new_tokens": 300, "tokens_per_byte": 0.30, "base_tokens_per_byte": 0.37},
              {"new_tokens": 207, "tokens_per_byte": 0.33, "base_tokens_per_byte": 0.37}]
    restores = [{"offered": 47, "kept": True, "tokens_per_byte": 0.32}, {"offered": 23, "kept": False, "tokens_per_byte": 0.315}]
    sentence = selection_sentence({"selection": {"rounds": rounds, "restores": restores, "kept": 254}})
    assert sentence.startswith("Term selection kept 254 of the 300 new tokens offered (93 removed in 2 rounds, then 47 "
                               "of them brought back, as the model stayed below the base model with them)")
    # the saving is the published tokens' (the kept batch), not the refused batch's
    assert "the validation text is 13.5% shorter in tokens where all 300 would have made it 18.9% shorter" in sentence


def test_the_selection_sentence_states_what_the_kept_restores_traded_in_bits_and_tokens():
    """Issue 37 item 3: a restore buys length with bits; the summary says how many of each."""
    rounds = [{"new_tokens": 300, "tokens_per_byte": 0.30, "base_tokens_per_byte": 0.37, "bits_per_byte": 1.53},
              {"new_tokens": 207, "tokens_per_byte": 0.33, "base_tokens_per_byte": 0.37, "bits_per_byte": 1.5024}]
    restores = [{"offered": 47, "kept": True, "tokens_per_byte": 0.32, "bits_per_byte": 1.5208},
                {"offered": 23, "kept": True, "tokens_per_byte": 0.3168, "bits_per_byte": 1.5269}]
    sentence = selection_sentence({"selection": {"rounds": rounds, "restores": restores, "kept": 277}})
    assert ("Bringing them back changed the judging half of the validation text by +0.0245 bits per byte "
            "(1.5024 -> 1.5269) for 4.0% fewer tokens.") in sentence


# --- through the door: best step 0 publishes the init; the report says what happened ----------


WRECKING = ["--steps", "2", "--batch-size", "1", "--seq-len", "64", "--lr", "1.0", "--embedding-lr-multiplier", "100",
            "--warmup-steps", "0"]  # every AdamW step moves each coordinate of a row by ~100


def _extend(out: Path, *args: str) -> dict:
    from app.cli import main

    code = main(["extend", "--base-model", "smollm2-135m", *WRECKING, "--eval-bytes", "1000", "--out", str(out), *args])
    assert code == 0
    return json.loads((out / "tide_extension.json").read_text())


def _init_rows(model, extension: dict) -> torch.Tensor:
    """The rows the job started from, remade from what tide_extension.json records (its init method, tokens, merges)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from extension.rows.init import RowInitializer
    from extension.tokenizer import NewToken

    extended = SimpleNamespace(new_tokens=[NewToken(**t) for t in extension["new_tokens"]], merges=[tuple(m) for m in extension["merges"]],
                               base_vocab_size=extension["base_vocab_size"])
    tokenizer = AutoTokenizer.from_pretrained(model.name_or_path)
    return RowInitializer(model, tokenizer, extension["init"].get("starts_from", extension["init"]["method"]))(model, extended).input


def test_training_that_hurts_publishes_the_init_and_reports_it(cli_env, tmp_path, smollm2):
    """Terms-only: the held-out contexts show step 0 best, so the init rows are published."""
    from transformers import AutoModelForCausalLM

    terms = tmp_path / "terms.txt"
    terms.write_text("multiprogramming\nmicrokernel\n")
    # precision 'checkpoint': the published rows are compared with ones remade from the fp32 checkpoint
    extension = _extend(tmp_path / "chosen", "--terms", str(terms), "--precision", "checkpoint")
    selection = extension["selection"]
    assert selection["mode"] == "validation" and selection["validation"]["source"] == "held-out generated contexts"
    curve = selection["validation_curve"]
    assert curve[0]["step"] == 0 and curve[-1]["step"] == 2 and selection["best_step"] == 0
    assert min(point["bits_per_byte"] for point in curve) == curve[0]["bits_per_byte"] < curve[-1]["bits_per_byte"]
    assert extension["published_step"] == 0 and extension["trained_steps"] == 2
    assert 0 < selection["validation_share"] and selection["seconds"]["validation"] > 0
    # the user's terms are all kept, each with its measured effect on the judging contexts; those hold
    # only what the model wrote after each prompt, so a term counts only where the model wrote it
    assert set(selection["effects"]) == {"multiprogramming", "microkernel"}
    assert selection["judging"]["bytes"] > 0 and all("net_bits" in effect for effect in selection["effects"].values())
    published = AutoModelForCausalLM.from_pretrained(tmp_path / "chosen")
    tokens = extension["new_tokens"]
    got = published.get_input_embeddings().weight[[t["id"] for t in tokens]]
    assert extension["init"]["method"] == "composition"
    assert torch.allclose(got, _init_rows(smollm2, extension), atol=1e-6)
    assert "chose the rows of step 0" in (tmp_path / "chosen" / "README.md").read_text()


def test_keep_all_terms_publishes_the_last_step_with_every_term_and_reports_on_the_test_split(
        cli_env, spanish_corpus, tmp_path, smollm2):
    from transformers import AutoModelForCausalLM

    from extension.evaluation import chunk_documents

    extension = _extend(tmp_path / "all", "--corpus", str(spanish_corpus), "--max-new-tokens", "24", "--keep-all-terms")
    assert extension["selection"] == {"mode": "none"}
    assert extension["published_step"] == 2 and extension["counts"]["new_vocab_entries"] == 24
    published = AutoModelForCausalLM.from_pretrained(tmp_path / "all")
    tokens = extension["new_tokens"]
    got = published.get_input_embeddings().weight[[t["id"] for t in tokens]]
    assert not torch.allclose(got, _init_rows(smollm2, extension), atol=1e-2)  # the (wrecked) trained rows, as asked
    # the job's numbers are on the test split, never the validation split decisions are made on

    def scored(split):
        return [c for doc in chunk_documents(split_documents(spanish_corpus, split), 1024, 1000) for c in doc]

    metrics = json.loads((tmp_path / "all" / "metrics.json").read_text())
    assert scored("test") != scored("validation")
    assert metrics["after"]["domain"]["bytes"] == sum(len(c.encode()) for c in scored("test"))
    assert metrics["after"]["domain"]["chunks"] == len(scored("test"))


def test_the_card_names_each_removed_term_with_its_measured_reason():
    from extension.publishing.card import selection_section

    selection = {"mode": "validation", "best_step": 40, "validation": {"source": "corpus validation split", "bytes": 6000},
                 "removed": [{"term": " cual", "tokens": ["Ġcual"], "round": 1, "occurrences": 9, "net_bits": 52.0,
                              "leak_bits": 1.2, "reason": "costs 52.0 bits more than it saves over its 9 uses in the validation text"}]}
    card = "\n".join(selection_section(selection))
    assert "chose the rows of step 40" in card and "`' cual'` | 9 | +52.0 | costs 52.0 bits more" in card


@pytest.fixture
def nested_merges(smollm2_tokenizer):
    """Three mined merges, the second built on the first (" zq" + "rx" -> " zqrx"; " zqrx" + "vw"),
    the third on neither: (rebuild, units, intermediate, built, unrelated)."""
    pieces = smollm2_tokenizer.convert_ids_to_tokens(smollm2_tokenizer(" zqrxvw", add_special_tokens=False)["input_ids"])
    assert len(pieces) >= 3, pieces
    first = (pieces[0], pieces[1])
    merges = [first, (first[0] + first[1], pieces[2]), (pieces[0], pieces[2])]
    rebuild = merges_rebuilder(smollm2_tokenizer, merges)
    units = token_units(rebuild([Unit(a + b, (a + b,)) for a, b in merges]))
    by_token = {unit.tokens[0]: unit for unit in units}
    return (rebuild, units, *(by_token[a + b] for a, b in merges))


def test_units_built_on_a_harmful_intermediate_are_found(nested_merges):
    # removing the first merge alone changes nothing, since the rebuild keeps what the second needs
    rebuild, units, intermediate, built, unrelated = nested_merges
    assert intermediate.tokens[0] in {t.token for t in rebuild([built]).new_tokens}  # the rebuild keeps it
    assert built_on_units([intermediate], units, rebuild) == {built: intermediate.name}
    assert built_on_units([unrelated], units, rebuild) == {}


def test_a_harmful_intermediate_goes_with_what_is_built_on_it_only_when_together_they_cost(nested_merges):
    rebuild, units, intermediate, built, unrelated = nested_merges

    def effects(built_bits: float, unrelated_bits: float = -1.0, unrelated_uses: int = 2) -> dict:
        return {intermediate.name: UnitEffect(occurrences=3, net_bits=10.0, leak_bits=0.0),
                built.name: UnitEffect(occurrences=5, net_bits=built_bits, leak_bits=0.0),
                unrelated.name: UnitEffect(occurrences=unrelated_uses, net_bits=unrelated_bits, leak_bits=unrelated_bits)}

    # the word built on the harmful piece saves 50 bits, more than the piece costs: both stay, and
    # since nothing harmful can go, the less useful half of the rest goes instead
    rebuilt, kept, gone = choose_removals(units, effects(-50.0), rebuild)
    assert set(gone) == {unrelated.name} and kept == [intermediate, built]
    assert {token.token for token in rebuilt.new_tokens} == {intermediate.tokens[0], built.tokens[0]}
    assert "least useful half" in gone[unrelated.name]
    # ... or, before that, a unit never seen in the text that only takes probability elsewhere
    rebuilt, kept, gone = choose_removals(units, effects(-50.0, unrelated_bits=0.5, unrelated_uses=0), rebuild)
    assert set(gone) == {unrelated.name} and "never used in the validation text" in gone[unrelated.name]
    # it saves only 5: together they cost 5 bits, so both go
    rebuilt, kept, gone = choose_removals(units, effects(-5.0), rebuild)
    assert set(gone) == {intermediate.name, built.name} and kept == [unrelated]
    assert "together they cost 5.0 bits more than they save" in gone[built.name]
    assert {token.token for token in rebuilt.new_tokens} == {unrelated.tokens[0]}


# --- cancelled while choosing terms ------------------------------------------------------------


def test_a_job_cancelled_during_term_selection_is_cancelled_not_failed(tiny_model_dir, tmp_path):
    """Issue 25, item 3: the cancel check answered inside the selection rounds stops the job as
    cancelled (JobCancelled, which the worker records as `cancelled`, or as a lost lease), not as
    `invalid_corpus` "no new token paid for itself". Through pipeline.run, the worker's door."""
    from extension import pipeline
    from extension.errors import JobCancelled
    from extension.plan.models import ModelSources
    from extension.plan.spec import Callbacks, ExtendSpec
    from tests.service.conftest import foldoc_documents

    # Made-up words only in the training documents: every mined token is unused in the
    # validation text, where it only takes probability, so the first round cannot pass and the
    # rounds go on (asking whether to stop) instead of keeping everything at once.
    made_up = " ".join(["zqxvorbinat", "kwplemtrosh", "vuxdragniel"] * 8)
    documents = []
    for doc in foldoc_documents(1500, skip=3100):
        if split_of(doc) != "train":
            documents.append(doc)
        elif split_of(f"{doc} {made_up}") == "train":  # (the split is the document's hash)
            documents.append(f"{doc} {made_up}")
    assert not any("zqx" in doc for doc in documents if split_of(doc) != "train")
    corpus = tmp_path / "foldoc.txt"
    corpus.write_text("\n\n".join(documents), encoding="utf-8")
    stages, events, asked = [], [], []

    def should_cancel():
        # yes once the select stage has begun: only its rounds ask then (the check before each
        # stage comes before the stage is announced)
        asked.append(stages[-1] == "select" if stages else False)
        return asked[-1]

    spec = ExtendSpec(base_model=str(tiny_model_dir), out_dir=tmp_path / "out", corpus_path=corpus, max_new_tokens=16,
                      steps=2, batch_size=2, seq_len=64, warmup_steps=0, eval_max_bytes=4000, device="cpu")
    callbacks = Callbacks(on_stage=stages.append, should_cancel=should_cancel,
                          on_event=lambda kind, payload: events.append((kind, payload)), work_dir=tmp_path / "work")
    with pytest.raises(JobCancelled) as stopped:
        pipeline.run(spec, callbacks, ModelSources(cache_dir=tmp_path / "cache"))
    # stopped inside the rounds, not at the next stage's check (the selection event comes after them)
    assert "selection" not in [kind for kind, _ in events], [p for kind, p in events if kind == "selection"]
    assert "during term selection" in str(stopped.value)
    assert stages[-1] == "select" and asked[-1] is True
    assert not (tmp_path / "out").exists()


def test_a_harmful_unit_whose_removal_would_leave_an_intermediate_in_its_place_stays_while_others_go(nested_merges):
    """Issue 26: removing a harmful token is priced as a return to the base's pieces; where the
    rebuild would instead cut its text into a kept intermediate (trained only inside longer
    tokens), the round leaves it while it has other harmful units to remove."""
    rebuild, units, intermediate, built, unrelated = nested_merges
    current = rebuild(units)
    effects = {intermediate.name: UnitEffect(occurrences=3, net_bits=-5.0, leak_bits=0.0),
               built.name: UnitEffect(occurrences=5, net_bits=4.0, leak_bits=0.0),
               unrelated.name: UnitEffect(occurrences=2, net_bits=3.0, leak_bits=0.0)}
    # without the rebuilt tokenizer's check, both harmful units go
    _, kept, gone = choose_removals(units, effects, rebuild)
    assert set(gone) == {built.name, unrelated.name} and kept == [intermediate]
    # with it, the word built on the kept piece stays: its text would read as that piece + the rest
    _, kept, gone = choose_removals(units, effects, rebuild, current=current)
    assert set(gone) == {unrelated.name} and kept == [intermediate, built]
    # when it is the only harmful unit, it goes all the same
    alone = {**effects, unrelated.name: UnitEffect(occurrences=2, net_bits=-3.0, leak_bits=0.0)}
    _, kept, gone = choose_removals(units, alone, rebuild, current=current)
    assert set(gone) == {built.name}


def test_a_restore_that_reads_worse_than_the_passing_selection_beyond_the_tolerance_is_refused(monkeypatch):
    """Issue 37 item 3: a restore try below the base but worse than the selection that passed
    (Chinese: 1.5024 -> 1.5208 -> 1.5269 bits per byte over kept restores) is refused beyond
    restore_tolerance, a fraction of the passing selection's judging score."""
    from types import SimpleNamespace

    from extension.selection import terms
    from extension.selection.terms import Selection, Unit, restore_units

    fold = SimpleNamespace
    passing, base = 1.5024, 1.60
    # the try reads 1.5208 on the judging half: below the base by far, 1.2% above the passing selection
    monkeypatch.setattr(terms, "score_folds", lambda *a, **k: (fold(bits_per_byte=1.50, tokens=90, bytes=300),
                                                          fold(bits_per_byte=1.5208, tokens=90, bytes=300)))
    monkeypatch.setattr(terms, "carry_rows", lambda *a, **k: ("rows", [0, 1]))
    monkeypatch.setattr(terms, "standard_error", lambda *a: 0.01)
    monkeypatch.setattr(terms, "token_effects", lambda *a, **k: [])
    monkeypatch.setattr(terms, "unexplained_bits_per_use", lambda *a: 0.0)
    monkeypatch.setattr(terms, "_unit_effects", lambda *a: {})
    validation = SimpleNamespace(folds=lambda: ([0], [1]), base=fold(tokens=100, bytes=300),
                                 base_fold=lambda f: fold(bits_per_byte=base, tokens=100, bytes=300))
    kept_unit, gone_unit = Unit("kept", ("a",)), Unit("gone", ("b",))
    rebuilt = SimpleNamespace(new_tokens=[SimpleNamespace(token="a"), SimpleNamespace(token="b")], base_vocab_size=10)

    def attempt(tolerance: float) -> Selection:
        chosen = Selection("passing", "passing rows", [0], [{"term": "gone", "occurrences": 3, "net_bits": 1.0}],
                           [{"round": 1, "bits_per_byte": passing}])
        restore_units(chosen, None, None, None, validation, units=[kept_unit, gone_unit], kept_units=[kept_unit],
                      rebuild=lambda units: rebuilt, pad_to_multiple_of=64, tries=1, tolerance=tolerance)
        return chosen

    refused = attempt(0.0)
    assert [r["kept"] for r in refused.restores] == [False]
    assert refused.extended == "passing" and [e["term"] for e in refused.removed] == ["gone"]
    assert refused.restores[0]["passing_bits_per_byte"] == passing
    within = attempt(0.02)  # 1.2% worse is within 2%
    assert [r["kept"] for r in within.restores] == [True] and within.extended is rebuilt and within.removed == []
