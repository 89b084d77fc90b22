"""What a job hands over: the checkpoint, adapter, tokenizer, card and manifest, written atomically.

    folder.py     publish: the staging folder renamed into place, shards, adapter, manifest (sha256)
    card.py       the model card: what was added, how, and the evidence
    decisions.py  what the job decided, in sentences: the CLI summary, the job page and the card share them
"""

from .card import model_card
from .decisions import decision_sentences
from .folder import MANIFEST, check_output_dir, publish, sha256_file, shard_limit

__all__ = ["model_card", "decision_sentences", "MANIFEST", "check_output_dir", "publish", "sha256_file", "shard_limit"]
