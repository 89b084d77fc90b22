"""General English text for the retention metric: what a job scores besides the domain, to show
what the new tokens cost on text that holds none of them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# General English text for the retention metric, first one present wins. The fortunes file is
# plain everyday English (Debian's `fortunes`, installed by scripts/setup.sh); Python's own
# documentation topics ship with every CPython, so a default always exists.
FORTUNES_PATH = Path("/usr/share/games/fortunes/fortunes")
PYDOC_TOPICS = "pydoc_data.topics"

_FORTUNE_SEPARATOR = re.compile(r"^%\s*$", re.MULTILINE)


@dataclass(frozen=True)
class GeneralText:
    """Documents of general text plus where they came from (recorded in the metrics, so a name,
    never a path: metrics reach the service's clients)."""

    documents: list[str]
    source: str


def read_fortune_file(path: Path) -> list[str]:
    """Entries of a fortune(6) file: blocks separated by lines holding only '%'."""
    text = Path(path).read_text(encoding="utf-8")
    return [entry.strip("\n") for entry in _FORTUNE_SEPARATOR.split(text) if entry.strip()]


def _pydoc_documents() -> list[str]:
    from pydoc_data import topics

    return [topics.topics[name].strip("\n") for name in sorted(topics.topics) if topics.topics[name].strip()]


def load_general_text(path: Path | str | None = None) -> GeneralText:
    """The general-English text used for retention.

    `path` overrides the default: a fortune file ('%' lines between entries) or any corpus file
    that `extension.plan.corpus.iter_documents` reads (blank-line separated text, or JSONL).
    """
    if path is not None:
        path = Path(path)
        head = path.read_text(encoding="utf-8", errors="replace")[:65536] if path.is_file() else ""
        if _FORTUNE_SEPARATOR.search(head):
            return GeneralText(read_fortune_file(path), path.name)
        from ..plan.corpus import iter_documents

        return GeneralText(list(iter_documents(path)), path.name)
    if FORTUNES_PATH.is_file():
        return GeneralText(read_fortune_file(FORTUNES_PATH), "debian:fortunes")
    return GeneralText(_pydoc_documents(), "python:" + PYDOC_TOPICS)

