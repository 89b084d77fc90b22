"""Every measured figure the README and docs/measured.md quote is tied to the results file that
holds it, and every link in the documentation resolves.

The rule, as the checker applies it:

* Statements. A table row is one statement; so is a heading; prose (paragraphs and list items) is
  split into sentences at `.`, `!` or `?` followed by white space. Fenced code blocks and HTML
  comments are skipped.
* A statement cites a results file by naming it: `benchmarks/results/NAME.md` (or `.json`, `.png`),
  which must exist, or the bare `NAME.md` / `NAME.json` of a file that exists in
  benchmarks/results/. A table row that names no file takes the files its table's header row names.
* A number in a statement is a figure unless it is one of these non-measurements:
  - inside a code span or a fenced block (commands, flags, ids, JSON, option values as typed);
  - part of a name: glued to letters (SmolLM2, 135M, fp32, x86_64, sha256) or a dotted version
    (0.3.36), or the version after a product name (Gemma 3, Qwen 2.5, Python 3.11; see VERSIONED);
  - inside a link's target or an HTML tag.
  A figure is written with its sign, its digits and its unit (`-4.79%`, `1.08x`, `0.93×`,
  `785.69 s`, `544 MB`), and that is how it must appear in the file.
* In README.md and docs/measured.md (STRICT):
  - a statement that cites results files: EVERY figure in it, plain counts included, appears as
    written (same sign, same digits, same unit) in one of the files it cites or in such a file's
    .json sibling;
  - a statement that cites none may hold plain whole numbers (counts and settings: "59 terms",
    "100 steps") but no measurement-looking figure: nothing signed, with a decimal point, a percent
    sign, an x/× or a unit of time or size.
* In the other docs pages (settings such as "30 s" or "16 MiB" are not measurements there), only
  statements that cite a results file are checked, and only their measurement-looking figures.
* "As written" means: not preceded by a sign, digit, letter, `.` or `,` other than the figure's own,
  and not followed by a digit, letter, `%`, `×` or a further decimal part. So `4.79%` does not
  match `-4.79%`, `0.21` does not match `0.21x`, `17.48%` does not match `117.48%`.

The self-tests mutate figures (a changed last digit, a flipped sign) and cited file names in a
copy of the README and of every statement, and require the checker to report each change that
the results files cannot explain.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

from .conftest import REPO

RESULTS = REPO / "benchmarks" / "results"
STRICT = ["README.md", "docs/measured.md"]
README_MAX_LINES = 150
THE_TWO_COMMANDS = [
    "bash scripts/setup.sh && .venv/bin/tide extend --base-model smollm2-135m --terms examples/terms.txt "
    "--steps 0 --out out/smollm2-computing --force",
    "bash scripts/test.sh",
]

# Product names whose following number is a version, not a figure ("Gemma 3 270M", "Qwen 2.5").
VERSIONED = ("Gemma", "Llama", "Qwen", "Qwen2", "Phi", "Mistral", "Mixtral", "GPT", "Python", "DeepSeek", "Falcon",
             "Redis", "Postgres", "Debian", "RFC", "ZeRO", "issue", "commit", "torch", "CUDA", "uid", "Gemma3n")
VERSION = re.compile(r"\b(?:" + "|".join(VERSIONED) + r")[ -]?\d+(?:\.\d+)*[a-z]?\b")
UNITS = r"ms|s|min|h|MB|GB|KB|kB|MiB|GiB|KiB|CPU-s"
NUMBER = re.compile(
    r"(?<![\w.,+\-−±])"
    r"(?P<sign>[-+−±])?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:e[-+]?\d+)?)"
    r"(?P<unit>%|[x×](?![A-Za-z])|\s?(?:" + UNITS + r")(?![\w-]))?"
    r"(?![\w%×]|[.,]\d)"
)
CITATION = re.compile(r"(?<![\w/.-])(?P<dir>benchmarks/results/)?(?P<name>[A-Za-z0-9_.-]+\.(?:md|json|png))")
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?(?:src|href)=\"(?P<target>[^\"]+)\"[^>]*>")
ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "etc.", "cf.")


@dataclass
class Statement:
    path: str
    line: int
    text: str
    kind: str  # "row", "header", "sentence"
    inherited: list[str] = field(default_factory=list)  # files named by the table's header row


@dataclass
class Figure:
    text: str  # as written: sign + digits + unit
    measurement: bool  # signed, decimal, or with a unit


# -- parsing ----------------------------------------------------------------------------------
def _blocks(markdown: str):
    """(first line number, kind, lines) of the markdown's tables, headings and prose paragraphs,
    fenced code and HTML comments left out."""
    markdown = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), markdown, flags=re.S)
    block: list[str] = []
    start = 0
    kind = None
    fenced = False

    def flush():
        nonlocal block, kind
        if block:
            yield start, kind, block
        block, kind = [], None

    for number, line in enumerate(markdown.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            yield from flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not stripped:
            yield from flush()
            continue
        if stripped.startswith("#"):
            yield from flush()
            yield number, "heading", [stripped.lstrip("#").strip()]
            continue
        line_kind = "table" if stripped.startswith("|") else "prose"
        new_item = line_kind == "prose" and re.match(r"(?:[-*+]|\d+\.)\s", stripped)
        if kind != line_kind or new_item:
            yield from flush()
            kind, start = line_kind, number
        block.append(stripped)
    yield from flush()


def _sentences(paragraph: str) -> list[str]:
    protected = paragraph
    for abbreviation in ABBREVIATIONS:
        protected = protected.replace(abbreviation, abbreviation.replace(".", "\0"))
    # never split inside a code span
    spans = re.split(r"(`[^`]*`)", protected)
    pieces, current = [], ""
    for i, span in enumerate(spans):
        if i % 2:
            current += span
            continue
        parts = re.split(r"(?<=[.!?])([)\"'*]*)\s+", span)
        # re.split with a group returns text, group, text, group, ...
        current += parts[0]
        for j in range(1, len(parts), 2):
            current += parts[j]
            pieces.append(current)
            current = parts[j + 1]
    pieces.append(current)
    return [p.replace("\0", ".").strip() for p in pieces if p.strip()]


def statements(markdown: str, path: str) -> list[Statement]:
    out: list[Statement] = []
    for start, kind, lines in _blocks(markdown):
        if kind == "heading":
            out.append(Statement(path, start, lines[0], "sentence"))
        elif kind == "table":
            header = lines[0]
            header_files = cited_files(header)
            out.append(Statement(path, start, header, "header"))
            for offset, row in enumerate(lines[1:], 1):
                if re.fullmatch(r"\|[\s:|-]+\|?", row):
                    continue
                out.append(Statement(path, start + offset, row, "row", inherited=header_files))
        else:
            for sentence in _sentences(" ".join(lines)):
                out.append(Statement(path, start, sentence, "sentence"))
    return out


def cited_files(text: str) -> list[str]:
    """Results files a statement names; a `benchmarks/results/` path that does not exist is
    returned too (it fails as a missing file)."""
    names = []
    for match in CITATION.finditer(text):
        name = match.group("name")
        if match.group("dir") or (RESULTS / name).is_file():
            names.append(name)
    return list(dict.fromkeys(names))


def _plain(text: str) -> str:
    """The statement as a reader sees its numbers: no code, link targets, tags or emphasis."""
    text = re.sub(r"`[^`]*`", " ", text)
    text = LINK.sub(lambda m: m.group("text"), text)
    text = re.sub(r"<[^>]+>", " ", text)
    text = text.replace("**", "").replace("__", "")
    text = re.sub(r"(?<![\w*])\*(?=\S)|(?<=\S)\*(?![\w*])", "", text)
    return VERSION.sub(" ", text)


def figures(text: str) -> list[Figure]:
    found = []
    for match in NUMBER.finditer(_plain(text)):
        sign, num, unit = match.group("sign") or "", match.group("num"), match.group("unit") or ""
        measurement = bool(sign or unit or "." in num)
        found.append(Figure(sign + num + unit, measurement))
    return found


# -- checking ---------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _results_text(name: str) -> str:
    path = RESULTS / name
    texts = []
    for candidate in (path, path.with_suffix(".json")):
        if candidate.is_file() and candidate.suffix in {".md", ".json"}:
            texts.append(candidate.read_text(encoding="utf-8"))
    return "\n".join(texts)


def written_in(figure: str, text: str) -> bool:
    return re.search(r"(?<![\w.,+\-−±])" + re.escape(figure) + r"(?![\w%×]|[.,]\d)", text) is not None


def check_statement(statement: Statement, strict: bool) -> list[str]:
    where = f"{statement.path}:{statement.line}"
    named = cited_files(statement.text)
    files = named or statement.inherited
    problems = [f"{where}: cites benchmarks/results/{name}, which does not exist"
                for name in files if not (RESULTS / name).is_file()]
    files = [name for name in files if (RESULTS / name).is_file()]
    found = figures(statement.text)
    if not files:
        if strict:
            loose = [f.text for f in found if f.measurement]
            if loose:
                problems.append(f"{where}: {loose} in a statement that names no results file: {statement.text[:160]!r}")
        return problems
    for figure in found:
        if not strict and not figure.measurement:
            continue
        if not any(written_in(figure.text, _results_text(name)) for name in files):
            problems.append(f"{where}: {figure.text!r} is not written so in {', '.join(files)}: {statement.text[:160]!r}")
    return problems


def check_document(markdown: str, path: str, strict: bool) -> list[str]:
    return [problem for statement in statements(markdown, path) for problem in check_statement(statement, strict)]


def _docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


# -- the tests --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", STRICT)
def test_every_figure_is_written_so_in_the_results_file_its_statement_names(name):
    problems = check_document((REPO / name).read_text(encoding="utf-8"), name, strict=True)
    assert not problems, "\n".join(problems)


def test_figures_the_other_docs_pages_tie_to_a_results_file_are_in_it():
    problems = []
    for path in _docs():
        if _relative(path) not in STRICT:
            problems += check_document(path.read_text(encoding="utf-8"), _relative(path), strict=False)
    assert not problems, "\n".join(problems)


def test_files_said_to_be_assembled_by_hand_say_so_in_their_header():
    problems = []
    for name in STRICT:
        for statement in statements((REPO / name).read_text(encoding="utf-8"), name):
            if "assembled by hand" not in statement.text:
                continue
            for cited in cited_files(statement.text) or statement.inherited:
                head = "\n".join((RESULTS / cited).read_text(encoding="utf-8").splitlines()[:12]).lower()
                if "assembled by hand" not in head:
                    problems.append(f"{name}:{statement.line}: calls {cited} assembled by hand; its header does not say so")
    assert not problems, "\n".join(problems)


def test_the_readme_is_a_front_page():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; depth belongs in docs/"
    first_screen = "\n".join(lines[:25])
    for command in THE_TWO_COMMANDS:
        assert command in first_screen, f"the first screen must show {command!r} exactly"


def test_every_docs_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    targets = {m.group("target").split("#")[0] for m in LINK.finditer(readme)}
    missing = [_relative(p) for p in sorted((REPO / "docs").glob("*.md")) if _relative(p) not in targets]
    assert not missing, f"docs pages the README does not link: {missing}"


def _slug(heading: str) -> str:
    text = _plain_heading(heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _plain_heading(heading: str) -> str:
    heading = LINK.sub(lambda m: m.group("text"), heading)
    return heading.replace("`", "").replace("**", "")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for _start, kind, lines in _blocks(path.read_text(encoding="utf-8")):
        if kind != "heading":
            continue
        slug = _slug(lines[0])
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _link_targets(markdown: str):
    for _start, kind, lines in _blocks(markdown):
        text = " ".join(lines)
        text = re.sub(r"`[^`]*`", " ", text)
        for match in LINK.finditer(text):
            yield match.group("target")
        for match in HTML_SRC.finditer(text):
            yield match.group("target")


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in _link_targets(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{path.name}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{path.name}: {target} (no such heading)")
    return broken


def test_every_relative_link_resolves():
    broken = [problem for path in _docs() for problem in broken_links(path)]
    assert not broken, "\n".join(broken)


def test_the_link_check_reports_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-section) [gone](missing.md) [no heading](other.md#nowhere) "
                    '<img src="missing.png">\n', encoding="utf-8")
    assert broken_links(page) == ["page.md: missing.md (no such file)", "page.md: other.md#nowhere (no such heading)",
                                  "page.md: missing.png (no such file)"]


# -- the checker checks itself ------------------------------------------------------------------
def _mutate_last_digit(figure: str) -> str:
    position = max(i for i, c in enumerate(figure) if c.isdigit())
    digit = str((int(figure[position]) + 1) % 10)
    return figure[:position] + digit + figure[position + 1:]


def _flip_sign(figure: str) -> str:
    if figure[0] in "+-−":
        return ("-" if figure[0] == "+" else "+") + figure[1:]
    return "-" + figure


def _replace_figure(text: str, old: str, new: str) -> str:
    """Replace the first occurrence of figure `old` outside the statement's code spans."""
    pattern = re.compile(r"(?<![\w.,+\-−±])" + re.escape(old) + r"(?![\w%×]|[.,]\d)")
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        changed = pattern.sub(lambda m: new, parts[i], count=1)
        if changed != parts[i]:
            parts[i] = changed
            return "".join(parts)
    return text


def _tied_figures(name: str):
    for statement in statements((REPO / name).read_text(encoding="utf-8"), name):
        files = [f for f in (cited_files(statement.text) or statement.inherited) if (RESULTS / f).is_file()]
        if files:
            yield statement, files


def _explained(mutant: str, files: list[str]) -> bool:
    """The mutated figure is itself written in a cited file: no checker can tell the change."""
    return any(written_in(mutant, _results_text(name)) for name in files)


@pytest.mark.parametrize("name", STRICT)
def test_the_checker_reports_every_changed_digit_and_flipped_sign(name):
    missed, tried = [], 0
    for statement, files in _tied_figures(name):
        for figure in {f.text for f in figures(statement.text)}:
            for mutant in (_mutate_last_digit(figure), _flip_sign(figure)):
                changed = _replace_figure(statement.text, figure, mutant)
                if changed == statement.text or _explained(mutant, files):
                    continue
                tried += 1
                mutated = Statement(statement.path, statement.line, changed, statement.kind, statement.inherited)
                if not check_statement(mutated, strict=True):
                    missed.append(f"{name}:{statement.line}: {figure} -> {mutant}")
    assert tried > 0
    assert not missed, "changes the checker did not report:\n" + "\n".join(missed)


@pytest.mark.parametrize("name", STRICT)
def test_the_checker_reports_every_swapped_results_file(name):
    others = sorted(p.name for p in RESULTS.glob("*.md"))
    missed, tried = [], 0
    for statement, files in _tied_figures(name):
        if not [f for f in figures(statement.text) if f.measurement] or not cited_files(statement.text):
            continue
        for cited in cited_files(statement.text):
            # the first other results file that does not hold every figure of the statement
            for other in others:
                if other in files:
                    continue
                changed = statement.text.replace(cited, other)
                mutated = Statement(statement.path, statement.line, changed, statement.kind, statement.inherited)
                figures_there = all(written_in(f.text, _results_text(o)) for f in figures(statement.text)
                                    for o in [other] + [x for x in files if x != cited])
                if figures_there:
                    continue
                tried += 1
                if not check_statement(mutated, strict=True):
                    missed.append(f"{name}:{statement.line}: {cited} -> {other}")
                break
    assert tried > 0
    assert not missed, "file swaps the checker did not report:\n" + "\n".join(missed)


def test_the_checker_fails_a_copy_of_the_readme_with_a_changed_figure_sign_or_file(tmp_path):
    """End to end, on a file: the README as it is passes; each single change to a copy fails."""
    original = (REPO / "README.md").read_text(encoding="utf-8")
    assert check_document(original, "README.md", strict=True) == []
    statement, files = next((s, f) for s, f in _tied_figures("README.md")
                            if s.kind == "row" and any(x.measurement and x.text[0] in "+-" for x in figures(s.text))
                            and cited_files(s.text))
    figure = next(x.text for x in figures(statement.text) if x.measurement and x.text[0] in "+-")
    cited = cited_files(statement.text)[0]
    other = next(p.name for p in sorted(RESULTS.glob("quality_*.md")) if p.name != cited)
    mutations = {
        "digit": statement.text.replace(figure, _mutate_last_digit(figure), 1),
        "sign": statement.text.replace(figure, _flip_sign(figure), 1),
        "file": statement.text.replace(cited, other),
        "file not there": statement.text.replace(cited, "no_such_results.md"),
    }
    for what, changed_row in mutations.items():
        assert changed_row != statement.text, what
        copy = tmp_path / f"README-{what.replace(' ', '-')}.md"
        copy.write_text(original.replace(statement.text, changed_row, 1), encoding="utf-8")
        problems = check_document(copy.read_text(encoding="utf-8"), copy.name, strict=True)
        assert problems, f"a {what} change in {statement.text!r} went unreported"


# -- counts that must mean what the results say (issue 37) -------------------------------------
# A count is checked by what it says, not only by being written somewhere in the file: "N tokens
# removed in round R" must be what round R removed, "N brought back" what the restore step kept.
COUNT_CLAIMS = {
    "removed_in_round": re.compile(r"\b(\d+) (?:new )?tokens?\s+removed in round (\d+)\b"),
    "round_left": re.compile(r"\bround (\d+) left (\d+) of the (\d+) offered tokens\b"),
    "brought_back": re.compile(r"\b(?:(\d+) (?:of them|(?:new )?tokens?|removed terms?) brought back|brought back (\d+))\b"),
    "stayed_removed": re.compile(r"\b(\d+) stayed removed\b"),
    "rounds": re.compile(r"\bafter (\d+) rounds\b"),
}


def count_claims(text: str) -> list[tuple[str, tuple[int, ...]]]:
    plain = re.sub(r"\s+", " ", _plain(text))
    return [(kind, tuple(int(g) for g in match.groups() if g is not None))
            for kind, pattern in COUNT_CLAIMS.items() for match in pattern.finditer(plain)]


def claim_holds(kind: str, numbers: tuple[int, ...], row: dict) -> bool:
    rounds = [r["new_tokens"] for r in row.get("rounds") or row.get("selection", {}).get("rounds") or []]
    restores = row.get("restores") or row.get("selection", {}).get("restores") or []
    if kind == "removed_in_round":
        count, number = numbers
        return number < len(rounds) and rounds[number - 1] - rounds[number] == count
    if kind == "round_left":
        number, left, offered = numbers
        return number < len(rounds) and rounds[number] == left and rounds[0] == offered
    if kind == "brought_back":
        return sum(r["offered"] for r in restores if r["kept"]) == numbers[0]
    if kind == "stayed_removed":
        return row.get("removed") == numbers[0]
    return len(rounds) == numbers[0]  # "after N rounds"


def check_counts(statement: Statement) -> list[str]:
    """Every count claim of a statement holds together in one row of a results JSON it cites."""
    claims = count_claims(statement.text)
    files = [name for name in (cited_files(statement.text) or statement.inherited) if (RESULTS / name).is_file()]
    if not claims:
        return []
    rows = []
    for name in files:
        path = (RESULTS / name).with_suffix(".json")
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            rows += data.get("rows", []) if isinstance(data, dict) else []
    if any(all(claim_holds(kind, numbers, row) for kind, numbers in claims) for row in rows):
        return []
    return [f"{statement.path}:{statement.line}: no row of {', '.join(files) or 'no results file'} has {claims}: "
            f"{statement.text[:200]!r}"]


@pytest.mark.parametrize("name", STRICT)
def test_selection_counts_say_what_the_results_json_says(name):
    found = [s for s in statements((REPO / name).read_text(encoding="utf-8"), name) if count_claims(s.text)]
    assert found or name == "README.md"
    problems = [problem for statement in found for problem in check_counts(statement)]
    assert not problems, "\n".join(problems)


def test_the_count_check_reports_the_round_1_misreading():
    """docs/measured.md once said '32 tokens removed in round 1, 53 of them brought back' where
    the JSON has 85 removed in round 1 (32 is what stayed removed after 53 came back)."""
    wrong = Statement("docs/measured.md", 1, "Chinese kept 92.1% (`quality_zh_cpu_bf16.md`): 32 tokens removed in "
                      "round 1, 53 of them brought back by the restore step.", "sentence")
    assert check_counts(wrong)
    right = Statement("docs/measured.md", 1, "Chinese (`quality_zh_cpu_bf16.md`): 85 tokens removed in round 1, "
                      "53 of them brought back, 32 stayed removed.", "sentence")
    assert not check_counts(right)
