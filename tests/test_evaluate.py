"""extension/evaluation/metrics.py: bits per byte, tokens per byte, new-token usage, before/after."""

from __future__ import annotations

import gzip
import math
import re
import textwrap
from pathlib import Path

import pytest
import torch

from extension.evaluation import scoring as evaluate
from extension.evaluation import (
    GeneralText,
    chunk_documents,
    compare,
    document_cap,
    evaluate_model,
    load_general_text,
    metrics_table,
    score_documents,
)
from tests.conftest import tiny_gemma3, tiny_llama

FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")
FORTUNES_ES = Path("/usr/share/games/fortunes/es")


def foldoc_entries(skip: int = 200, count: int = 40) -> list[str]:
    """FOLDOC entries (headword + dedented body), read from the installed dict-foldoc package."""
    with gzip.open(FOLDOC, "rt", encoding="utf-8") as handle:
        raw = handle.read(2_000_000)
    entries = re.split(r"\n(?=\S)", raw)[skip : skip + count]
    return [textwrap.dedent(entry).strip() for entry in entries if entry.strip()]


def hand_bits_per_byte(model, tokenizer, documents: list[str]) -> float:
    """Each document as one sequence after BOS, full logits, plain log-softmax: no batching,
    padding, slicing or chunking involved."""
    nats = 0.0
    size = 0
    with torch.no_grad():
        for document in documents:
            ids = [tokenizer.bos_token_id] + tokenizer(document, add_special_tokens=False)["input_ids"]
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
            logprobs = torch.log_softmax(logits, dim=-1)
            nats -= float(logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum())
            size += len(document.encode("utf-8"))
    return nats / (math.log(2) * size)


# ---------------------------------------------------------------------------------------------
# Cutting text by bytes


def test_chunks_are_byte_bounded_whole_characters_and_rebuild_the_text():
    spanish = "El pingüino comió ñoquis en la montaña; ¿quién lo diría? " * 20
    chinese = "天下没有不散的筵席。" * 30  # 3-byte characters and no whitespace
    documents = [spanish, chinese, "short"]
    result = chunk_documents(documents, chunk_bytes=64, max_bytes=None)
    assert ["".join(chunks) for chunks in result] == documents
    for chunks in result:
        assert all(0 < len(chunk.encode("utf-8")) <= 64 for chunk in chunks)
    # Latin text is cut just before a space, so the next chunk starts with " word".
    assert all(chunk.startswith(" ") for chunk in result[0][1:])
    # Chinese has no space: cut at the last whole character that fits (21 x 3 bytes).
    assert [len(c.encode("utf-8")) for c in result[1][:-1]] == [63] * (len(result[1]) - 1)


def test_max_bytes_keeps_the_first_bytes_in_document_order():
    documents = ["alpha beta gamma", "delta epsilon zeta", "eta theta"]
    result = chunk_documents(documents, chunk_bytes=1024, max_bytes=25)
    assert result == [["alpha beta gamma"], ["delta"]]
    assert chunk_documents([], chunk_bytes=64, max_bytes=10) == []


def test_document_bytes_keeps_each_documents_first_bytes_only():
    documents = ["alpha beta gamma delta", "eta", "theta iota kappa"]
    result = chunk_documents(documents, chunk_bytes=1024, max_bytes=None, document_bytes=11)
    assert result == [["alpha beta"], ["eta"], ["theta iota"]]
    # the cap is per document: the total budget still stops at max_bytes
    assert chunk_documents(documents, chunk_bytes=1024, max_bytes=13, document_bytes=11) == [["alpha beta"], ["eta"]]


def test_document_cap_spreads_the_text_over_documents_and_still_fills_the_budget():
    # enough documents: each gives at most an eighth (never under one chunk)
    assert document_cap([40_000] * 9, 20_000) == 2_500
    assert document_cap([40_000] * 9, 4_000) == 1_024
    # few long documents: the cap rises until the budget is filled, as evenly as they allow
    assert document_cap([40_000, 40_000], 20_000) == 10_000
    assert document_cap([1_000, 40_000, 40_000], 21_000) == 10_000
    # everything fits whole: no cap; none asked: none given
    assert document_cap([500, 700], 20_000) is None
    assert document_cap([40_000], None) is None


def test_held_out_text_is_spread_over_documents_and_reported():
    # The first long document must not be the whole test text (the Perl manual's 20 KB were one page).
    documents = ["ab ca " * 200, *BIGRAM_DOCS * 8]  # 1,200 bytes, then 24 short ones
    result = evaluate_model(bigram_llama(bigram_table(False)), bigram_tokenizer(False), documents, None,
                            chunk_bytes=16, max_bytes=400)
    cap = result["settings"]["document_bytes"]
    assert cap == 50  # an eighth of 400
    assert result["domain"]["documents"] > 8
    assert 350 < result["domain"]["bytes"] <= 400


# ---------------------------------------------------------------------------------------------
# A bigram world where two tokenizations of one text get exactly the same probability


P = {"a": 0.3, "b": 0.2, "c": 0.1, " ": 0.4}
VOCAB = {"<bos>": 0, "a": 1, "b": 2, "c": 3, " ": 4, "ab": 5}
IMPOSSIBLE = -1e9


def bigram_tokenizer(with_merge: bool):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(vocab=dict(VOCAB), merges=[("a", "b")] if with_merge else []))
    core.add_special_tokens(["<bos>"])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>")


def bigram_table(with_merge: bool) -> torch.Tensor:
    """log P(next token | current token). Without the merge: bytes i.i.d. from P. With it, the
    exact token process that BPE's greedy "ab" merge induces on the same byte process: after
    any token but "a" the next "a" is an "a" NOT followed by "b"; after an "a" token the next
    byte is known not to be "b"."""
    table = torch.full((len(VOCAB), len(VOCAB)), IMPOSSIBLE, dtype=torch.float64)
    pa, pb, pc, ps = P["a"], P["b"], P["c"], P[" "]
    for prev in VOCAB.values():
        if not with_merge:
            row = {"a": pa, "b": pb, "c": pc, " ": ps}
        elif prev == VOCAB["a"]:
            row = {"a": pa, "ab": pa * pb / (1 - pb), "c": pc / (1 - pb), " ": ps / (1 - pb)}
        else:
            row = {"a": pa * (1 - pb), "ab": pa * pb, "b": pb, "c": pc, " ": ps}
        assert math.isclose(sum(row.values()), 1.0)
        for token, probability in row.items():
            table[prev, VOCAB[token]] = math.log(probability)
    return table


def bigram_llama(table: torch.Tensor):
    """A real LlamaForCausalLM whose weights make logits = table[current token]: attention and
    MLP write nothing (o_proj, down_proj zero), embeddings are one-hot, RMSNorm turns one-hot
    into sqrt(hidden) x one-hot, and the untied head holds the table."""
    model = tiny_llama(vocab_size=len(VOCAB), tied=False)
    model.config.rms_norm_eps = 0.0
    model.model.norm.variance_epsilon = 0.0
    hidden = model.config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, : len(VOCAB)] = torch.eye(len(VOCAB))
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, : len(VOCAB)] = (table.T / math.sqrt(hidden)).float()
    return model


BIGRAM_DOCS = [
    "ab cab aab bc abab c",
    "c b aac abcab ab ab abc bab aabb cc ab",
    "abababab ab ac bc cab aab",
]


def test_same_text_same_bits_per_byte_under_two_tokenizations():
    base = evaluate_model(
        bigram_llama(bigram_table(False)), bigram_tokenizer(False), BIGRAM_DOCS, None,
        new_token_ids=[5], chunk_bytes=16,
    )["domain"]
    merged = evaluate_model(
        bigram_llama(bigram_table(True)), bigram_tokenizer(True), BIGRAM_DOCS, None,
        new_token_ids=[5], chunk_bytes=16,
    )["domain"]
    # The merge makes the text shorter and each token carries more bits...
    assert merged["tokens"] < base["tokens"]
    assert merged["bits_per_token"] > base["bits_per_token"] * 1.05
    # ...but per byte the two tokenizations of the same distribution agree.
    assert merged["bits_per_byte"] == pytest.approx(base["bits_per_byte"], rel=1e-6)
    # And it equals the byte process's own entropy of this text, computed from P directly.
    text_bits = -sum(math.log2(P[ch]) for doc in BIGRAM_DOCS for ch in doc)
    assert base["bits_per_byte"] == pytest.approx(text_bits / sum(map(len, BIGRAM_DOCS)), rel=1e-6)


def test_tokens_per_byte_and_new_token_usage_on_a_small_example():
    tokenizer = bigram_tokenizer(True)
    model = bigram_llama(bigram_table(True))
    # "abab cab" -> ab ab " " c ab: 5 tokens for 8 bytes, 3 of them the new id 5.
    assert tokenizer("abab cab", add_special_tokens=False)["input_ids"] == [5, 5, 4, 3, 5]
    result = score_documents(model, tokenizer, ["abab cab", "cb"], new_token_ids=[5])
    assert result["bytes"] == 10 and result["tokens"] == 7
    assert result["tokens_per_byte"] == pytest.approx(7 / 10)
    assert result["new_tokens"] == 3
    assert result["new_token_usage"] == pytest.approx(3 / 7)
    assert result["distinct_new_tokens_used"] == 1
    unmarked = score_documents(model, tokenizer, ["abab cab"], new_token_ids=None)
    assert unmarked["new_token_usage"] is None


# ---------------------------------------------------------------------------------------------
# Against a hand computation on tiny random models with real tokenizers


def test_bits_per_byte_equals_hand_computation(smollm2_tokenizer):
    model = tiny_llama(vocab_size=len(smollm2_tokenizer), tied=True)
    documents = foldoc_entries(count=6)
    documents = [doc[:600] for doc in documents]  # each fits in one 1024-byte chunk
    expected = hand_bits_per_byte(model, smollm2_tokenizer, documents)
    # Small budgets force several batches of different widths and several logit slices.
    result = score_documents(
        model, smollm2_tokenizer, documents, chunk_bytes=1024, batch_tokens=300, logit_elements=50_000
    )
    assert result["bits_per_byte"] == pytest.approx(expected, rel=1e-5)
    assert result["chunks"] == len(documents)
    tokens = sum(len(smollm2_tokenizer(d, add_special_tokens=False)["input_ids"]) for d in documents)
    assert result["tokens_per_byte"] == pytest.approx(tokens / sum(len(d.encode()) for d in documents))


def test_full_forward_path_agrees_with_decoder_plus_head(smollm2_tokenizer):
    model = tiny_llama(vocab_size=len(smollm2_tokenizer), tied=False)
    documents = foldoc_entries(skip=300, count=5)
    sequences = [[1, *smollm2_tokenizer(d[:400], add_special_tokens=False)["input_ids"]] for d in documents]
    with torch.inference_mode():
        sliced = evaluate.Scorer(model, batch_tokens=256, logit_elements=60_000).score(sequences, pad_id=1)
        full = evaluate.Scorer(model, batch_tokens=256, logit_elements=60_000, use_head_path=False).score(
            sequences, pad_id=1
        )
    assert sliced == pytest.approx(full, rel=1e-5)


def test_gemma_soft_capped_logits_and_big_vocab(gemma3_tokenizer):
    model = tiny_gemma3(vocab_size=len(gemma3_tokenizer))
    model.config.final_logit_softcapping = 3.0  # makes the head path differ unless applied
    documents = ["El pingüino comió ñoquis en la montaña.", "Rendering a {B-tree} in {Lisp}, 1998."]
    expected = hand_bits_per_byte(model, gemma3_tokenizer, documents)
    result = score_documents(model, gemma3_tokenizer, documents, logit_elements=1 << 20)
    assert result["bits_per_byte"] == pytest.approx(expected, rel=1e-5)


def test_rows_adapter_attached_and_merged_score_the_same(smollm2_tokenizer):
    """The pipeline may score a model with the rows adapter attached or after merge()."""
    from extension.rows.init import subword_mean_rows
    from extension.rows.adapter import attach
    from extension.tokenizer import extend_tokenizer

    extended = extend_tokenizer(smollm2_tokenizer, ["hypertext", "immunohistochemistry", "backpropagation"])
    new_ids = [token.id for token in extended.new_tokens]
    model = tiny_llama(vocab_size=len(smollm2_tokenizer), tied=False)
    adapter = attach(model, extended.base_vocab_size, subword_mean_rows(model, extended.new_tokens, extended.base_vocab_size))
    docs = ["The hypertext page explains backpropagation.",
            "immunohistochemistry uses hypertext and backpropagation for immunohistochemistry."]
    attached = score_documents(model, extended.tokenizer, docs, new_token_ids=new_ids)
    adapter.merge()
    merged = score_documents(model, extended.tokenizer, docs, new_token_ids=new_ids)
    assert attached["new_tokens"] == merged["new_tokens"] == 6
    # Merged padding rows keep a sliver of probability (the adapter masks them): < 0.1% here.
    assert merged["bits_per_byte"] == pytest.approx(attached["bits_per_byte"], rel=1e-3)


def test_chunk_longer_than_the_model_context_is_refused(smollm2_tokenizer):
    model = tiny_llama(vocab_size=len(smollm2_tokenizer))  # 256 positions
    with pytest.raises(ValueError, match="lower chunk_bytes"):
        score_documents(model, smollm2_tokenizer, [" ".join(["word"] * 600)], chunk_bytes=4096)


def test_a_tokenizer_without_bos_or_eos_needs_an_explicit_context():
    tokenizer = bigram_tokenizer(False)
    tokenizer.bos_token = None
    model = bigram_llama(bigram_table(False))
    with pytest.raises(ValueError, match="context_id"):
        score_documents(model, tokenizer, ["abc"])
    assert score_documents(model, tokenizer, ["abc"], context_id=0)["tokens"] == 3


# ---------------------------------------------------------------------------------------------
# General text, before/after, the card table


def test_general_text_default_and_overrides(tmp_path):
    default = load_general_text()
    assert default.documents and all(doc.strip() for doc in default.documents)
    assert sum(len(d) for d in default.documents) > 20_000
    fortune = tmp_path / "mine"
    fortune.write_text("First saying.\n%\nSecond\nsaying, two lines.\n%\n", encoding="utf-8")
    assert load_general_text(fortune).documents == ["First saying.", "Second\nsaying, two lines."]
    plain = tmp_path / "plain.txt"
    plain.write_text("One paragraph.\n\nAnother one.\n", encoding="utf-8")
    loaded = load_general_text(plain)
    # the source is recorded in metrics, which reach the service's clients: a name, not a path
    assert loaded.documents == ["One paragraph.", "Another one."] and loaded.source == "plain.txt"
    assert "/" not in default.source


def test_compare_and_card_table():
    before = {
        "domain": {"bits_per_byte": 1.6, "tokens_per_byte": 0.30, "new_token_usage": None},
        "general": {"bits_per_byte": 1.75, "tokens_per_byte": 0.24, "bytes": 100, "source": "x"},
    }
    after = {
        "domain": {"bits_per_byte": 1.5, "tokens_per_byte": 0.24, "new_token_usage": 0.1, "bytes": 5000,
                   "distinct_new_tokens_used": 42},
        "general": {"bits_per_byte": 1.7675, "tokens_per_byte": 0.24, "bytes": 100, "source": "x"},
        "settings": {"chunk_bytes": 1024, "context_token": "<s>"},
    }
    change = compare(before, after)
    assert change["domain_bits_per_byte"]["delta"] == pytest.approx(-0.1)
    assert change["domain_tokens_per_byte"]["ratio"] == pytest.approx(0.8)
    assert change["general_bits_per_byte"]["ratio"] == pytest.approx(1.01)
    assert change["domain_new_token_usage"] == {"after": 0.1}
    table = metrics_table(before, after)
    assert "| Domain bits per byte (lower is better) | 1.6000 | 1.5000 | -6.25% |" in table
    assert "| General-English bits per byte (retention) | 1.7500 | 1.7675 | +1.00% |" in table
    assert "10.00%" in table and "42 distinct" in table
    # A terms-only job has no domain text: only the general rows remain.
    only_general = compare({"domain": None, "general": before["general"]}, {"domain": None, "general": after["general"]})
    assert set(only_general) == {"general_bits_per_byte", "general_tokens_per_byte"}


@pytest.mark.slow
def test_real_smollm2_on_foldoc_gives_plausible_bits_per_byte(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path)
    general = GeneralText(load_general_text().documents, "default")
    result = evaluate_model(model, tokenizer, foldoc_entries(), general, max_bytes=2500, new_token_ids=[])
    domain = result["domain"]
    assert 0.5 < domain["bits_per_byte"] < 3.0
    assert 0.15 < domain["tokens_per_byte"] < 0.5
    assert domain["bytes"] <= 2500 and domain["new_token_usage"] == 0.0
    assert 0.5 < result["general"]["bits_per_byte"] < 3.0
    assert result["settings"]["context_token"] == tokenizer.bos_token
