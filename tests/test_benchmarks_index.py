"""benchmarks/ has an index a reader can find their way in (issue 36, Build item 3).

* Every script in benchmarks/*.py has a row in the table of benchmarks/README.md (its name in the
  first cell).
* Every file in benchmarks/results/ is cited, by its file name, by README.md, a page under docs/,
  a test under tests/, or benchmarks/README.md. A `.json` beside a cited `.md` of the same name
  counts as cited with it: the scripts write both, and tests/test_readme_numbers.py reads the
  `.json` sibling as part of the `.md` a statement names. A results file nobody cites is a
  superseded trial: it leaves the tree (git keeps it).
* The results files the index table names exist, and README.md links the index.
"""

from __future__ import annotations

import re

from .conftest import REPO

BENCHMARKS = REPO / "benchmarks"
RESULTS = BENCHMARKS / "results"
INDEX = BENCHMARKS / "README.md"
NAME = re.compile(r"(?<![\w.-])([A-Za-z0-9_.-]+\.(?:md|json|png))(?![\w-])")


def _index_rows() -> list[str]:
    """The rows of the index's first table (the one whose header names the script column)."""
    rows, inside = [], False
    for line in INDEX.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("|"):
            if not inside and "script" not in stripped.lower():
                continue
            inside = True
            rows.append(stripped)
        elif inside:
            break
    return rows[2:]  # header and separator


def _citing_texts() -> dict[str, str]:
    paths = [REPO / "README.md", INDEX, *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "tests").rglob("*.py"))]
    return {path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8") for path in paths if path.is_file()}


def _cited_names() -> set[str]:
    return {match.group(1) for text in _citing_texts().values() for match in NAME.finditer(text)}


def test_the_index_exists():
    assert INDEX.is_file(), "benchmarks/README.md, the index of the benchmarks, is missing"


def test_every_benchmark_script_has_a_row_in_the_index():
    assert INDEX.is_file(), "benchmarks/README.md is missing"
    first_cells = {row.strip("|").split("|")[0].strip().strip("`") for row in _index_rows()}
    scripts = sorted(path.name for path in BENCHMARKS.glob("*.py"))
    assert scripts
    missing = [name for name in scripts if name not in first_cells]
    assert not missing, f"scripts benchmarks/README.md's table does not list: {missing}"


def test_every_results_file_is_cited_by_a_doc_a_test_or_the_index():
    cited = _cited_names()
    uncited = []
    for path in sorted(RESULTS.iterdir()):
        if path.name in cited:
            continue
        if path.suffix == ".json" and path.with_suffix(".md").name in cited and path.with_suffix(".md").is_file():
            continue
        uncited.append(path.name)
    assert not uncited, (f"{len(uncited)} results files that README.md, docs/, tests/ and benchmarks/README.md "
                         f"do not cite (superseded trials leave the tree; git keeps them): {uncited}")


def test_the_results_files_the_index_names_exist():
    """Each row's last cell (today's answer) names files that are there (links to docs/ left out)."""
    assert INDEX.is_file(), "benchmarks/README.md is missing"
    answers = [re.sub(r"\[[^\]]*\]\([^)]*\)", " ", row.strip("|").split("|")[-1]) for row in _index_rows()]
    named = {match.group(1) for answer in answers for match in NAME.finditer(answer)}
    assert named
    missing = sorted(name for name in named if not (RESULTS / name).is_file())
    assert not missing, f"benchmarks/README.md's table names results files that are not in benchmarks/results/: {missing}"


def test_the_readme_links_the_index():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "](benchmarks/README.md)" in readme, "README.md does not link benchmarks/README.md"
