"""The documentation's references resolve inside the repository.

Every relative Markdown link and image (``[text](path#anchor)``) in every
tracked ``.md`` file points at a file that exists, and its ``#anchor`` at a
heading of that file (GitHub's anchor rule); every ``docs/...md#anchor``
named in code comments, docstrings and docs does too; nothing points at the
development machine's notes outside the repository (the math a reader needs
is in docs/math.md); and every file of the results log is listed in its
index.
"""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT_SUFFIXES = (".md", ".py", ".sh", ".ini", ".cfg", ".toml", ".txt")


def _tracked(suffixes):
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return sorted({p for p in out.splitlines() if p.endswith(suffixes) and os.path.isfile(os.path.join(ROOT, p))})


def _outside_fences(text):
    """The lines outside ``` fences."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped (word
    characters, spaces and hyphens kept), spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """Every heading anchor of a Markdown file (repeated headings get -1, -2, ...)."""
    seen, out = {}, set()
    with open(path, encoding="utf-8") as f:
        for line in _outside_fences(f.read()):  # a heading's code spans count: GitHub keeps their text
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                s = slug(m.group(1))
                n = seen.get(s, 0)
                out.add(s if n == 0 else f"{s}-{n}")
                seen[s] = n + 1
    return out


def test_slug_follows_githubs_rule():
    assert slug("Sinkhorn iterations (`--sinkhorn-iters n`)") == "sinkhorn-iterations---sinkhorn-iters-n"
    assert slug("The paper's equations in the code") == "the-papers-equations-in-the-code"
    assert slug("Quick start (CPU, about 9 minutes)") == "quick-start-cpu-about-9-minutes"


def _links(md_path):
    with open(os.path.join(ROOT, md_path), encoding="utf-8") as f:
        for line in _outside_fences(f.read()):
            line = re.sub(r"`[^`]*`", "", line)  # a link inside a code span is not a link
            for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
                if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
                    yield target


def _check(target, base_dir, where):
    """None if ``target`` (path[#anchor], relative to base_dir) resolves, else why not."""
    path, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(base_dir, path)) if path else os.path.join(ROOT, where)
    if not full.startswith(ROOT + os.sep):
        return f"{where}: {target} points outside the repository"
    if not os.path.exists(full):
        return f"{where}: {target}: no such file"
    if anchor and full.endswith(".md") and anchor not in anchors(full):
        return f"{where}: {target}: no heading with the anchor #{anchor} in {os.path.relpath(full, ROOT)}"
    return None


def test_markdown_links_resolve():
    problems = []
    for md in _tracked((".md",)):
        base = os.path.dirname(os.path.join(ROOT, md))
        problems += [p for p in (_check(t, base, md) for t in _links(md)) if p]
    assert not problems, "\n".join(problems)


def test_docs_named_anywhere_exist_with_their_anchors():
    """``docs/x.md`` and ``docs/x.md#anchor`` in code comments, docstrings,
    messages and docs, read from the repository root."""
    problems = []
    for name in _tracked(TEXT_SUFFIXES):
        if name == "tests/test_docs.py":  # its docstrings name docs/x.md as an example
            continue
        with open(os.path.join(ROOT, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for ref in set(re.findall(r"(?<![\w/.-])docs/[\w/.-]+\.md(?:#[\w-]+)?", text)):
            problem = _check(ref, ROOT, name)
            if problem:
                problems.append(problem)
    assert not problems, "\n".join(problems)


# The notes folder beside the development checkout, and its math file's name;
# joined here so that this file does not name them itself.
OUTSIDE_NOTES = ["/".join(("shared", "docs")), "-".join(("attention", "math.md"))]


@pytest.mark.parametrize("pattern", OUTSIDE_NOTES)
def test_nothing_points_at_the_development_machines_notes(pattern):
    hits = []
    for name in _tracked(TEXT_SUFFIXES):
        with open(os.path.join(ROOT, name), encoding="utf-8", errors="replace") as f:
            hits += [f"{name}:{i}" for i, line in enumerate(f, 1) if pattern in line]
    assert not hits, f"{pattern} (outside the repository; the math is in docs/math.md): " + ", ".join(hits)


def test_every_result_is_in_the_index():
    folder = os.path.join(ROOT, "docs", "results")
    with open(os.path.join(folder, "README.md"), encoding="utf-8") as f:
        index = f.read()
    missing = [n for n in sorted(os.listdir(folder)) if n.endswith(".md") and n != "README.md"
               and f"]({n})" not in index]
    assert not missing, f"docs/results/README.md does not list {missing}"


# ------------------------------------------------------- the layout (docs/layout.md)

def _layout_entries():
    """(depth, names) of each entry of docs/layout.md's block: a line
    indented by two spaces a level, names separated by ", " (a folder ends in
    /), then two or more spaces and the description; lines indented 20 or
    more continue a description."""
    with open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"# Layout\n.*?```\n(.*?)```", text, re.S).group(1)
    entries = []
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent >= 20:
            continue
        assert indent % 2 == 0, f"layout line indented by {indent}: {line!r}"
        names = re.split(r"\s{2,}", line.strip())[0]
        entries.append((indent // 2, [n.strip() for n in names.split(",")]))
    return entries


def _layout_paths():
    """{path: is_leaf} of the block: a folder whose entries are listed under
    it is a heading (its files must each be listed); one without covers every
    file below it."""
    entries = _layout_entries()
    paths, parents = {}, []
    for i, (depth, names) in enumerate(entries):
        parents = parents[:depth]
        prefix = "".join(parents)
        has_children = i + 1 < len(entries) and entries[i + 1][0] > depth
        for name in names:
            paths[prefix + name] = not has_children
        if has_children:
            assert len(names) == 1 and names[0].endswith("/"), f"only a folder has entries under it: {names}"
            parents.append(names[0])
    return paths


def test_layout_matches_git_ls_files():
    tracked = set(_tracked(("",)))
    paths = _layout_paths()
    missing = [p for p in paths if not (p in tracked or (p.endswith("/") and any(t.startswith(p) for t in tracked)))]
    assert not missing, f"docs/layout.md names what git does not track: {missing}"
    leaves = [p for p, leaf in paths.items() if leaf]
    uncovered = [t for t in sorted(tracked) if not any(t == p or (p.endswith("/") and t.startswith(p)) for p in leaves)]
    assert not uncovered, f"docs/layout.md misses: {uncovered}"


# ------------------------------------------- guides say what is true now

def _guides():
    """The guides: what is true now (dated records live in docs/results/)."""
    return [p for p in _tracked((".md",)) if not p.startswith(("docs/results/", "tests/"))]


def test_no_commit_hashes_in_guides():
    """A guide names no commit (it would go stale with the next one): the
    history is in git, dated records in docs/results/."""
    log = subprocess.run(["git", "log", "--format=%H"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if len(log) < 2:
        pytest.skip("no git history (a source archive)")
    short = {h[:7] for h in log}
    hits = []
    for name in _guides():
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                line = re.sub(r"\]\([^)]*\)", "]()", line)  # a record's file name in a link is not a commit
                hits += [f"{name}:{i}: {w}" for w in re.findall(r"\b[0-9a-f]{7,40}\b", line) if w[:7] in short]
    assert not hits, "commit hashes in guides: " + ", ".join(hits)


def test_no_test_counts_in_guides():
    """Pass and test counts go stale with the next test: the records in
    docs/results/ keep them, pytest prints them."""
    pattern = re.compile(r"\b\d[\d,]* (?:passed|skipped|tests marked)\b|--co\b.*\blists the \d+")
    hits = []
    for name in _guides():
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            hits += [f"{name}:{i}" for i, line in enumerate(f, 1) if pattern.search(line)]
    assert not hits, "test counts in guides: " + ", ".join(hits)
