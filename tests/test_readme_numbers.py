"""Every measured figure the README quotes appears, written the same way, in a results file that
a benchmark script wrote (benchmarks/results/). Figures are decimals, percentages, ratios (1.08x)
and amounts with a unit (ms, MB, s); counts and settings (100 steps, batch 4) are not checked."""

from __future__ import annotations

import re

from .conftest import REPO

FIGURE = re.compile(r"(?<![\w.])[-+−]?\d[\d,]*(?:\.\d+)?(?:%|x|×|\s?(?:ms|MB|CPU-s|s)\b)|(?<![\w.])[-+−]?\d+\.\d+(?![\w.])")


def _measured_section() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("## Measured")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _number(figure: str) -> str:
    return re.sub(r"[^\d.,]", "", figure).strip(".,")


def test_every_measured_figure_is_in_a_results_file():
    results = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "benchmarks" / "results").glob("*") if p.suffix in {".md", ".json"})
    missing = []
    for figure in FIGURE.findall(_measured_section()):
        number = _number(figure)
        if not re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d])", results):
            missing.append(figure.strip())
    assert not missing, f"figures in README's Measured section that no results file holds: {missing}"
