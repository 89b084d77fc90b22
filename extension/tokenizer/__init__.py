"""Extend a fast BPE tokenizer with new terms: new BPE merges where they provably work, added
tokens with word-boundary matching where they do not.

Why merges first: extra merges in `tokenizer.json` are ordinary BPE to every runtime (transformers,
vLLM, TGI, llama.cpp), while added tokens lose their `single_word` flag in llama.cpp and then match
inside other words. Text that contains none of the new token strings encodes exactly as before,
and llama.cpp's converter probe text keeps its ids.

One module an idea, in the order a term travels:
  terms.py           read and check the terms (app/ applies the same rules at submit time)
  base_view.py       what the base tokenizer does to text; text vs the BPE strings its vocab holds
  contexts.py        the natural contexts a term must be one token in, and checking them
  merge_plan.py      planning the merges that join a term's pieces (an interval dynamic program)
  probe_text.py      llama.cpp's probe text, which must keep its ids
  tokenizer_json.py  new ids (after every id in use), the extended tokenizer.json, loading it
                     as a transformers tokenizer, the checks that no old id moves
  extend.py          extend_tokenizer: the steps above, until every term checks out
  append_merges.py   the corpus miner's entry point: append the merges it chose
  results.py         ExtendedTokenizer and the records in it
  reserved.py        new_ids 'reserved': which reserved tokens are free, checked before any weights
  onto_reserved.py   the chosen new tokens moved onto those ids (the tokenizer rewritten)
"""

from .append_merges import extend_with_merges
from .contexts import SPACE_CONTEXTS, START_CONTEXTS
from .extend import MECHANISMS, extend_tokenizer
from .probe_text import LLAMA_CPP_PROBE_TEXT, probe_text_unchanged
from .results import ExtendedTokenizer, NewToken, SkippedTerm, TermExtension
from .terms import clean_terms, normalized_term, nothing_to_add_error, read_terms_file
from .tokenizer_json import check_extendable

__all__ = [
    "LLAMA_CPP_PROBE_TEXT",
    "MECHANISMS",
    "SPACE_CONTEXTS",
    "START_CONTEXTS",
    "ExtendedTokenizer",
    "NewToken",
    "SkippedTerm",
    "TermExtension",
    "check_extendable",
    "clean_terms",
    "extend_tokenizer",
    "extend_with_merges",
    "normalized_term",
    "nothing_to_add_error",
    "probe_text_unchanged",
    "read_terms_file",
]
