"""One source for every figure: the pages quote their dated records.

A measured figure is written by hand once, in its dated record under
``docs/results/``. Every page that shows one (``README.md``, ``docs/*.md``,
``examples/*/README.md``, ``docs/results/README.md``) is checked here against
the records (the rule is written out in docs/results/README.md, "How a page
quotes a figure"):

- a page is cut into units: a table row, or a paragraph (a list item is its
  own paragraph); code blocks, code spans, link targets, HTML comments, dates
  and clock times are not figures;
- a unit that links a record (``docs/results/YYYY-MM-DD-*.md``) quotes it:
  every number in the unit, settings such as "600 updates" or "T 1,024"
  included, appears in one of the records it links (``+-``/``±`` and
  thousands separators normalised, numbers compared by value);
- a unit that states a measured figure (a ratio such as ``1.03x``, a
  ``+-``/``±`` spread, a percentage, a time in s/ms/minutes, a memory size,
  a decimal next to a metric's name, or a table row of three or more
  decimals) without a record link of its own
  reads the records linked in its section (up to the next heading: a table
  under its caption, readings under their table) and is checked against
  them; with no record in reach it fails; a unit that quotes
  figures not measured here (the paper's, the thesis's) says so with an
  ``<!-- not measured here: ... -->`` comment on the line above it (for a
  table: above the table);
- no page says a figure is stale (``STALE``: "to be re-done" and the like): a row is
  current or gone (superseded figures stay in their dated records).

Two stricter checks stay as they were: each figure of the current-figures
table is written in its record as the table writes it (and the README's two
commands quote their times from that table, so a new fresh-clone measurement
updates one table), and a recipe README's "Current results" table rows are
copies of rows of the records its section links.
"""

import decimal
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join("docs", "results")

# A record's file name, at the end of a link target (relative from any page).
RECORD_LINK = re.compile(r"\]\((?:[\w./-]*/)?(?:docs/results/)?(\d{4}-\d{2}-\d{2}-[\w.-]+\.md)(?:#[\w-]*)?\)")
NOT_MEASURED = re.compile(r"<!--\s*not measured here:.*?-->")
CURRENT_FIGURES_LINK = re.compile(r"\]\((?:[\w./-]*/)?(?:docs/)?results/README\.md#current-figures\)")
# Written with \s+ so that `git grep` for the phrases finds no page, and not this file either.
STALE = re.compile(r"to\s+be\s+re-?done|still\s+to\s+run|to\s+be\s+rerun|not\s+yet\s+(?:re)?measured\s+again", re.I)

# What is not a figure: removed before numbers are read.
NOT_FIGURES = [
    re.compile(r"<!--.*?-->", re.S),                      # comments
    re.compile(r"`[^`]*`"),                                # code spans: commands, flags, names
    re.compile(r"\]\([^)]*\)"),                            # link targets (the link text stays)
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),                 # dates
    re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b"),          # clock times
    re.compile(r"https?://\S+"),
    re.compile(r"\b\d+% warm-?up"),  # a setting of the schedule
    re.compile(r"\b95% (?:percentile )?(?:bootstrap )?(?:confidence )?intervals?"),  # a setting of the statistics
    re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),  # commits
    re.compile(r"(?:\b[A-Z][a-z]+,? |\(|, )20[0-2]\d\b(?!-)"),  # a year: Kinley 2020, (2020), thesis, 2020
    # versions: Python 3.11, torch >= 2.6, fairseq 0.12.3, CPython 3.11/3.12; a platform
    re.compile(r"(?i)\b(?:c?python|torch|fairseq|cuda|triton|transformers|numpy)[\w`-]*\W{0,3}(?:[<>=]=?\s*)?"
               r"\d+(?:\.\d+)+(?:/\d+(?:\.\d+)+)*"),
    re.compile(r"\b\d+\.\d+\.\d+(?:\.\d+)?\b|\bx86-64\b|\bsm_\d+"),
    # a threshold is a setting: ROUGE-1 >= 6, T <= 128
    re.compile(r"(?:[<>]=?|≤|≥)\s*\d[\d,]*(?:\.\d+)?"),
    # references to the paper's or thesis's parts: Table 6.1, Tables 6.2 and 6.4, section 5.2
    re.compile(r"\b(?:Tables?|Figures?|[Ss]ections?|Theorem|Algorithm|Appendix|Eq\.)\s+\d+(?:\.\d+)?"
               r"(?:\s*(?:,|and|-)\s*\d+(?:\.\d+)?)*"),
]
NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z]-)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:[eE][-+]?\d+)?(?![\d])")

# What states a measured figure.
METRIC = r"(?:accuracy|BLEU|chrF|ROUGE|F1|MCC|perplexity|tau|precision|recall|GPU time|time per|x fairseq|x SDPA)"
MEASURED = [
    re.compile(r"(?<![\w.])\d+(?:\.\d+)?x(?![\w])"),                       # a ratio: 1.03x
    re.compile(r"\d\s*(?:\+-|±)\s*\d"),                                     # a spread over seeds
    re.compile(r"\d(?:\.\d+)?\s?%"),                                        # a percentage
    re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:s|ms|µs|minutes|seconds|MiB|GiB)\b"),  # time, memory
    re.compile(METRIC + r"[^|.;]{0,40}?(?<![\w.])\d+\.\d+", re.I),           # a metric, then a decimal
]


def numbers(text):
    """The numbers of ``text`` that may be figures, as Decimals."""
    for pattern in NOT_FIGURES:
        text = pattern.sub(" ", text)
    text = text.replace("±", "+-")
    out = set()
    for m in NUMBER.finditer(text):
        out.add(decimal.Decimal(m.group(0).replace(",", "")).normalize())
    return out


def states_a_figure(text):
    for pattern in NOT_FIGURES:
        text = pattern.sub(" ", text)
    # a table row of three or more decimals is a row of results
    return any(p.search(text) for p in MEASURED) or (
        text.startswith("|") and len(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", text)) >= 3)


def units(text):
    """(first line number, text, exempt) of each table row and paragraph
    outside code fences; ``exempt``: a ``not measured here`` comment stands
    on the line above the paragraph or the table."""
    out, block, start, fenced, exempt_next, table_exempt = [], [], 0, False, False, False

    def flush():
        nonlocal block, exempt_next
        if block:
            out.append((start, " ".join(block), exempt_next))
            exempt_next = False
        block = []

    indented_code = False
    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        # an indented code block: four spaces after a blank line, up to the next blank line
        indented_code = bool(stripped) and (indented_code or (not block and line.startswith("    ")))
        if indented_code and not fenced:
            continue
        if stripped.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if NOT_MEASURED.fullmatch(stripped):
            flush()
            exempt_next = True
            continue
        if stripped.startswith("|"):
            flush()
            if not table_exempt and exempt_next:
                table_exempt = True
            out.append((i, stripped, table_exempt))
            exempt_next = False
            continue
        table_exempt = False
        if not stripped or stripped.startswith("#") or re.match(r"([-*]|\d+\.)\s", stripped):
            flush()
            if stripped.startswith("#"):
                out.append((i, stripped, False))
                continue
        if stripped:
            if not block:
                start = i
            block.append(stripped)
    flush()
    return out


def pages():
    """The pages that show figures: the README, the guides in docs/, the
    results index and the recipes' READMEs."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    return sorted(p for p in listed if os.path.isfile(os.path.join(ROOT, p))
                  and re.fullmatch(r"README\.md|docs/[\w-]+\.md|docs/results/README\.md|examples/[\w-]+/README\.md", p))


_RECORDS = {}


def record_numbers(name):
    if name not in _RECORDS:
        path = os.path.join(ROOT, RESULTS, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if name == "README.md":  # the index: only its current-figures table is a source
            text = re.search(r"## Current figures\n(.*?)(?:\n## |\Z)", text, re.S).group(1)
        _RECORDS[name] = numbers(text)
    return _RECORDS[name]


def sections(text):
    """Each unit with the record links of its section (the units under one
    heading, up to the next heading of any level)."""
    out, current = [], []
    for unit in units(text):
        if unit[1].startswith("#"):
            current = []
            out.append((unit, current))
            continue
        current += [r for r in RECORD_LINK.findall(unit[1]) if r not in current]
        out.append((unit, current))
    return out


def problems(page, text):
    """Why each unit of ``page`` breaks the rule (empty: it keeps it)."""
    out = []
    for (line, unit, exempt), section_records in sections(text):
        where = f"{page}:{line}"
        stale = STALE.search(re.sub(r"`[^`]*`", " ", unit))  # a code span may name the phrases
        if stale:
            out.append(f"{where}: says a figure is stale ({stale.group(0)!r}): "
                       "show the current one with its record, or remove the row")
            continue
        if exempt:
            continue
        # its own links; else, where it states a figure, its section's (a table or a list reads
        # the record its section links); a unit that neither links nor states a figure is prose
        own = sorted(set(RECORD_LINK.findall(unit)))
        if CURRENT_FIGURES_LINK.search(unit):
            own.append("README.md")  # the current-figures table of docs/results/README.md
        figure = states_a_figure(unit)
        records = own or (sorted(set(section_records)) if figure else [])
        missing_files = [r for r in records if not os.path.isfile(os.path.join(ROOT, RESULTS, r))]
        if missing_files:
            out.append(f"{where}: links records that do not exist: {missing_files}")
        elif records:
            known = set().union(*(record_numbers(r) for r in records))
            stray = sorted(n for n in numbers(unit) if n not in known)
            if stray:
                out.append(f"{where}: {', '.join(format(n, 'f') for n in stray)} not in {', '.join(records)}")
        elif figure:
            out.append(f"{where}: states a figure without a record in docs/results/ linked from it or "
                       f"its section: {unit[:120]}")
    return out


# ------------------------------------------------------------ the rule itself

def test_numbers_normalise_separators_and_spreads():
    assert numbers("77.9 +- 0.2 and 1,024 tokens; 0.245") == {decimal.Decimal(x).normalize()
                                                              for x in ("77.9", "0.2", "1024", "0.245")}
    assert numbers("77.9 ± 0.2") == numbers("77.9 +- 0.2")
    assert numbers("`--lr 5e-4` [x](2026-11-27-a.md) on 2026-11-27 at 01:30, fp16, sm_90") == set()
    assert numbers("1.00 and 1") == {decimal.Decimal(1)}


def test_what_states_a_figure():
    for text in ("DNAS 1.03x", "77.9 +- 0.2", "96.7% at depth 1", "640 s", "0.37 MiB",
                 "BLEU 8.13", "Kendall tau 0.245"):
        assert states_a_figure(text), text
    assert states_a_figure("| UNAS | 5.520 | 8.400 / 7.457 |")
    assert not states_a_figure("| `--hybrid-init U` | 0.5 (0.1 in `*_gigaword`) |")
    for text in ("fairseq's `transformer` (base)", "12 + 12 layers", "head size 64", "Table 6.1",
                 "`--hybrid-init U` | 0.5", "Python 3.11"):
        assert not states_a_figure(text), text


def test_a_row_that_contradicts_its_record_fails():
    """README's earlier Table 6.1 row (its UNAS cell), pointed at the
    3-seed record that replaced it: 0.019 is not in that record (78.7 and
    0.099 happen to be, in other rows: the check is by value, per record)."""
    row = ("| SST (Jain & Wallace split), accuracy (%) / Kendall tau | thesis-size encoders from scratch, "
           "mean +- s.e. of 3 seeds | 78.7 +- 0.2 / 0.099 +- 0.019 | "
           "[examples/discrete/](docs/results/2026-11-27-cpu-table61-3seeds.md) |")
    found = problems("README.md", row)
    assert len(found) == 1 and "0.019 not in 2026-11-27-cpu-table61-3seeds.md" in found[0], found
    good = ("| SST, accuracy (%) / Kendall tau | 3 seeds | 77.9 +- 0.2 / 0.245 | "
            "[record](docs/results/2026-11-27-cpu-table61-3seeds.md) |")
    assert problems("README.md", good) == []


def test_a_figure_without_a_record_fails_unless_marked():
    assert problems("x.md", "DNAS is 1.28x per update.")
    assert problems("x.md", "<!-- not measured here: the paper's Table 3 -->\n| a | 38.02 +- 0.1 |\n| b | 1.5x |") == []
    assert problems("x.md", "<!-- not measured here: the paper -->\n| a | 38.02 +- 0.1 |\n\nthen 1.5x") != []


def test_stale_phrases_fail():
    still, redone = " ".join(("still", "to", "run")), " ".join(("to", "be", "redone"))
    assert problems("x.md", f"| Table 6.5 | 1 seed (the 3-seed table is {still}) |")
    assert problems("x.md", f"measured before the change ({redone})")
    assert problems("x.md", f"the phrase in a code span: `{redone}`") == []


# ------------------------------------------------------------ the pages

@pytest.mark.parametrize("page", pages())
def test_every_figure_on_the_page_is_its_records(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        found = problems(page, f.read())
    assert not found, "\n".join(found)


# ------------------------------------------------------------ the current-figures table and the README's times

def _current_figures():
    """(fact, figure, record file) of each row of docs/results/README.md's
    current-figures table."""
    with open(os.path.join(ROOT, "docs", "results", "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"## Current figures\n(.*?)(?:\n## |\Z)", text, re.S).group(1)
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("fact", "---"):
            record = re.search(r"\]\(([\w.-]+\.md)\)", cells[2])
            assert record, f"a current figure without its record: {line}"
            rows.append((cells[0], cells[1].strip("*"), record.group(1)))
    return rows


def test_every_current_figure_is_in_its_record():
    """Each figure of the current-figures table, as written there (the
    page-wide rule below also checks its other numbers by value)."""
    rows = _current_figures()
    assert len(rows) >= 5
    for fact, figure, record in rows:
        with open(os.path.join(ROOT, "docs", "results", record), encoding="utf-8") as f:
            assert figure in f.read(), f"{fact}: {figure} is not in {record}"


def test_the_readme_times_are_the_current_figures():
    """The README's two commands quote their times from the current-figures
    table, and link it; no other guide gives those times."""
    figures = {fact: figure for fact, figure, _ in _current_figures()}
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    commands = readme[readme.index("## Two commands"):readme.index("\n## ", readme.index("## Two commands") + 1)]
    quoted = re.findall(r"Time: (.*?)\(\[current figures\]\(docs/results/README\.md#current-figures\)\)", commands, re.S)
    assert len(quoted) == 2, "each of the two commands: 'Time: ... ([current figures](docs/results/README.md#current-figures))'"
    for fact in ("install", "Gigaword quickstart", "README test command"):
        assert figures[fact] in commands, f"the README does not quote the current {fact} figure {figures[fact]}"
    others = [f for f in re.findall(r"\b\d[\d,]* s\b", " ".join(quoted)) if f not in figures.values()]
    assert not others, f"times in the README's two commands that are not current figures: {others}"


# ------------------------------------------------------------ the recipes' current results

RECIPES_WITH_CURRENT_RESULTS = ("discrete", "gigaword", "hf", "masked_lm", "translation")


def test_recipe_result_tables_are_their_records():
    """A recipe README's current results are copies of its dated record:
    every table row there (with a figure) is a row of a record the section
    links in docs/results/."""
    for recipe in sorted(os.listdir(os.path.join(ROOT, "examples"))):
        path = os.path.join(ROOT, "examples", recipe, "README.md")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        m = re.search(r"\n## Current results\n(.*?)(?:\n## |\Z)", text, re.S)
        if m is None:
            assert recipe not in RECIPES_WITH_CURRENT_RESULTS, f"examples/{recipe}/README.md: no current results"
            continue
        records = set(re.findall(r"\]\(\.\./\.\./docs/results/([\w.-]+\.md)(?:#[\w-]+)?\)", m.group(1)))
        assert records, f"examples/{recipe}/README.md: current results without a record in docs/results/"
        record_text = "".join(open(os.path.join(ROOT, "docs", "results", r), encoding="utf-8").read() for r in records)
        rows = [line for line in m.group(1).splitlines() if line.startswith("|") and re.search(r"\d", line)]
        assert rows
        stray = [row for row in rows if row not in record_text]
        assert not stray, f"examples/{recipe}/README.md rows not in {sorted(records)}: {stray}"
