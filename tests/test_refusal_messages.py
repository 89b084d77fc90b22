"""Issue 40 item 6: a refusal says what is unsupported and what to do instead. A Unigram
tokenizer (T5-style, Metaspace always) takes new terms only as added tokens, and there they
change how other text decodes: the terms are already split into several pieces, so the advice
to "give terms the tokenizer splits into several pieces" was wrong."""

from __future__ import annotations

from extension.tokenizer import extend_tokenizer
from extension.tokenizer.terms import nothing_to_add_error

from .test_tokenizer import _foldoc


def _unigram_always():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.decoder = decoders.Metaspace(prepend_scheme="always")
    tok.train_from_iterator(_foldoc(0, 100_000).split("\n"), trainers.UnigramTrainer(
        vocab_size=600, special_tokens=["<unk>"], unk_token="<unk>", show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_a_unigram_refusal_names_what_is_unsupported_and_what_to_do():
    tokenizer = _unigram_always()
    terms = ["hexadecimal", "immunohistochemistry"]
    assert all(len(tokenizer.tokenize(term)) > 1 for term in terms)
    extended = extend_tokenizer(tokenizer, terms, embedding_rows=len(tokenizer))
    assert not extended.new_tokens
    message = str(nothing_to_add_error(terms, extended.skipped, "t5-like"))
    assert "several pieces" not in message
    assert "Unigram tokenizer takes new terms only as added tokens" in message
    assert "BPE" in message


def test_terms_that_are_already_one_token_are_told_to_give_split_ones():
    tokenizer = _unigram_always()
    single = next(t for t in ["the", "of", "and"] if len(tokenizer.tokenize(t)) == 1)
    extended = extend_tokenizer(tokenizer, [single], embedding_rows=len(tokenizer))
    assert "splits into several pieces" in str(nothing_to_add_error([single], extended.skipped, "t5-like"))
