"""Corpus mining: choose the new vocabulary entries that save the most tokens on a domain corpus.

    mine_terms(tokenizer, corpus_path, max_new_tokens=300, min_frequency=3) -> MiningResult

The result carries the merges, one MinedTerm per new entry, the extended tokenizer
(extension.tokenizer.ExtendedTokenizer) and a report with the held-out tokens per byte and the
no-document-longer check. Modules: vocabulary (the base tokenizer's words and pieces),
bpe_continuation (the merge loop), filters, check (the full-corpus comparison), miner.
"""

from .bpe_continuation import Merge, continue_bpe
from .filters import MiningFilters
from .miner import check_mining_options, mine_terms
from .result import MinedTerm, MiningResult

__all__ = [
    "Merge",
    "MinedTerm",
    "MiningFilters",
    "MiningResult",
    "check_mining_options",
    "continue_bpe",
    "mine_terms",
]
