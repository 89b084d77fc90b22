"""The before/after of a job: bits per byte (comparable across tokenizers), tokens per byte and
new-token usage, on the held-out domain text and on general English.

    general_text.py  the general English text scored for retention
    scoring.py       cutting text into chunks by bytes and scoring them identically for any tokenizer
    metrics.py       evaluate_model (one model, both texts), compare (before vs after), metrics_table
    score_cache.py   the base model's scores kept on disk across jobs
"""

from .general_text import GeneralText, load_general_text, read_fortune_file
from .metrics import COMPARED, compare, evaluate_model, metrics_table
from .score_cache import ScoreCache
from .scoring import DEFAULT_CHUNK_BYTES, Scorer, chunk_documents, context_token_id, document_cap, score_documents

__all__ = [
    "GeneralText", "load_general_text", "read_fortune_file", "COMPARED", "compare", "evaluate_model", "metrics_table",
    "ScoreCache", "DEFAULT_CHUNK_BYTES", "Scorer", "chunk_documents", "context_token_id", "document_cap", "score_documents",
]
