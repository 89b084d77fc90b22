"""The new embedding rows: where each starts, and the adapter that holds them beside the frozen base.

    init.py         NewRows; the starts from the term's ORIGINAL pieces (subword mean, composition);
                    writing rows into a resized model (apply_rows), padding rows kept unlikely
    composition.py  rows composed the way the base vocabulary composes its own merges (a ridge fit)
    adapter.py      RowsAdapter: the new rows in their own parameters (tied: one set; untied: input,
                    output and bias), lookups and the fused loss without a full-size matrix copy
"""

from .adapter import IGNORE_INDEX, RowsAdapter, attach
from .composition import fit_composition
from .init import INIT_METHODS, NewRows, RowInitializer, apply_rows, init_method, is_tied, padded_vocab_size, row_method, subword_mean_rows

__all__ = [
    "IGNORE_INDEX", "RowsAdapter", "attach", "fit_composition", "INIT_METHODS", "NewRows", "RowInitializer",
    "apply_rows", "init_method", "is_tied", "padded_vocab_size", "row_method", "subword_mean_rows",
]
