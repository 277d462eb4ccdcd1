"""The documentation holds together: no broker, no network.

* Every relative link in README.md, CHANGELOG.md and docs/**/*.md names a
  file (or directory) that exists, and a `#fragment` into a markdown file
  names a heading (GitHub's anchor for it) or an explicit anchor there.
  Links to http(s):// and mailto: are not checked. Links inside code
  (fenced blocks and `code spans`) are not links.
* The pages other pages rely on exist, the generated ones included
  (docs/configuration.md and docs/protocol.md are generated from the code).
* README.md stays a front door: at most 200 lines, linking every page in
  docs/.
* docs/conformance.md names tests that exist, and a behaviour it says
  holds in both modes names a `@both_modes` test.
"""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import REPO_ROOT

README_MAX_LINES = 200
REQUIRED = [
    "README.md", "CHANGELOG.md",
    "docs/exactly-once.md", "docs/operations.md", "docs/cluster.md", "docs/security.md",
    "docs/performance.md", "docs/architecture.md", "docs/testing.md",
    "docs/configuration.md", "docs/protocol.md", "docs/conformance.md",
]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); text may hold one level of [brackets]
_INLINE_LINK = re.compile(
    r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
_HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_HTML_ANCHOR = re.compile(r"<[a-z][^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_SKIP_SCHEMES = re.compile(r"^(?:https?:|mailto:)", re.I)
_OTHER_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def doc_files(root):
    root = Path(root)
    files = [root / "README.md", root / "CHANGELOG.md"]
    files += sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    return [f for f in files if f.is_file()]


def prose_lines(text):
    """(line number, line) of every line outside fenced code blocks, with
    code spans masked (their text kept aside so link texts read as written)."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line.strip()[len(m.group(1)):].strip():
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        yield n, line


def mask_code(line):
    """The line with each code span replaced by a placeholder free of
    brackets and parentheses, and the function that puts them back."""
    spans = []

    def keep(m):
        spans.append(m.group(0))
        return f"\x00{len(spans) - 1}\x00"

    masked = _CODE_SPAN.sub(keep, line)
    return masked, lambda s: re.sub(r"\x00(\d+)\x00", lambda m: spans[int(m.group(1))], s)


def links(text):
    """(line number, link text, target) of every link in a markdown text."""
    out = []
    for n, line in prose_lines(text):
        masked, unmask = mask_code(line)
        for m in _INLINE_LINK.finditer(masked):
            target = m.group(2)
            out.append((n, unmask(m.group(1)), target.strip("<>")))
        m = _REF_DEF.match(masked)
        if m:
            out.append((n, m.group(1), m.group(2).strip("<>")))
        for m in _HTML_LINK.finditer(masked):
            out.append((n, m.group(1), m.group(1)))
    return out


def rendered_text(heading):
    """A heading's text as GitHub renders it (what its anchor is made of)."""
    t = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    t = re.sub(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", t)
    t = re.sub(r"<[^>]+>", "", t)
    t, unmask = mask_code(t)  # code keeps its *, ~ and _ as written
    t = re.sub(r"[*~]", "", t)
    t = re.sub(r"(?<![0-9A-Za-z])_+|_+(?![0-9A-Za-z])", "", t)  # _emphasis_, not snake_case
    t = re.sub(r"(`+)(.+?)\1", r"\2", unmask(t))
    return t.strip()


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped
    (letters, digits, `_`, `-` and spaces kept), spaces to hyphens."""
    t = rendered_text(heading).lower()
    t = "".join(c for c in t if c.isalnum() or c in "_- ")
    return t.replace(" ", "-")


def anchors(text):
    """Every anchor a markdown text defines: its headings' slugs (a repeated
    slug gets -1, -2, … as on GitHub) and explicit id/name attributes."""
    found, seen = set(), {}
    for _, line in prose_lines(text):
        m = _ATX.match(line)
        if m:
            s = slug(m.group(2))
            if s in seen:
                seen[s] += 1
                s = f"{s}-{seen[s]}"
            else:
                seen[s] = 0
            found.add(s)
        for a in _HTML_ANCHOR.findall(line):
            found.add(a)
    return found


def broken_links(path, root):
    """Each broken relative link of the markdown file `path` as
    `file:line: [text](target): why`."""
    path, root = Path(path), Path(root)
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(root)
    out = []
    anchor_cache = {}

    def anchors_of(p):
        if p not in anchor_cache:
            anchor_cache[p] = anchors(p.read_text(encoding="utf-8"))
        return anchor_cache[p]

    for n, label, target in links(text):
        if _SKIP_SCHEMES.match(target):
            continue
        where = f"{rel}:{n}: [{label}]({target})"
        if _OTHER_SCHEME.match(target):
            out.append(f"{where}: not a relative link, nor http(s) or mailto")
            continue
        file_part, _, fragment = target.partition("#")
        file_part = unquote(file_part)
        if file_part:
            dest = (root / file_part.lstrip("/")) if file_part.startswith("/") \
                else (path.parent / file_part)
        else:
            dest = path
        dest = Path(dest)
        if not dest.exists():
            out.append(f"{where}: no such file {dest.resolve().relative_to(root.resolve()) if dest.resolve().is_relative_to(root.resolve()) else dest}")
            continue
        if fragment and dest.is_file() and dest.suffix.lower() == ".md":
            if unquote(fragment) not in anchors_of(dest.resolve()):
                out.append(f"{where}: no heading or anchor #{fragment} in "
                           f"{dest.resolve().relative_to(root.resolve())}")
    return out


# --- the repository's documents --------------------------------------------------

@pytest.mark.parametrize("doc", [str(f.relative_to(REPO_ROOT)) for f in doc_files(REPO_ROOT)])
def test_relative_links_resolve(doc):
    broken = broken_links(REPO_ROOT / doc, REPO_ROOT)
    assert not broken, f"{len(broken)} broken link(s) in {doc}:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", REQUIRED)
def test_required_page_exists(page):
    assert (REPO_ROOT / page).is_file(), (
        f"{page} is missing" + (" (it is generated from the code)"
                                if page in ("docs/configuration.md", "docs/protocol.md") else ""))


def test_readme_is_a_front_door():
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; at most {README_MAX_LINES}: move detail into docs/")


def test_readme_links_every_docs_page():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    targets = {t.partition("#")[0] for _, _, t in links(readme)}
    pages = {p for p in REQUIRED if p.startswith("docs/")}
    pages |= {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").glob("*.md")}
    missing = sorted(pages - targets)
    assert not missing, "README.md does not link: " + ", ".join(missing)


# --- the checker itself ---------------------------------------------------------

def test_the_checker_finds_broken_links_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Page A\n\n## The `oncelog diff` tool: read_committed\n\n## Twice\n\n## Twice\n\n"
        "```sh\n# not a heading\n```\n<a id=\"explicit\"></a>\n", encoding="utf-8")
    (tmp_path / "CHANGELOG.md").write_text("# Changes\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("\n".join([
        "# Readme",
        "[ok](docs/a.md) [ok anchor](docs/a.md#the-oncelog-diff-tool-read_committed)",
        "[second](docs/a.md#twice-1) [explicit](docs/a.md#explicit) [self](#readme)",
        "![img](docs/a.md) [web](https://example.com/x) [mail](mailto:x@example.com)",
        "[`code` text](docs/missing.md)",
        "[bad anchor](docs/a.md#not-a-heading)",
        "[bad self](#nowhere) [third](docs/a.md#twice-2)",
        "`[in code](docs/none.md)`",
        "```",
        "[in a block](docs/none.md)",
        "```",
        "[ref]: docs/gone.md",
    ]) + "\n", encoding="utf-8")
    broken = broken_links(tmp_path / "README.md", tmp_path)
    assert len(broken) == 5, "\n".join(broken)
    assert any("[`code` text](docs/missing.md)" in b and "README.md:5:" in b for b in broken), broken
    assert any("#not-a-heading" in b for b in broken), broken
    assert any("#nowhere" in b for b in broken), broken
    assert any("#twice-2" in b for b in broken), broken
    assert any("docs/gone.md" in b for b in broken), broken
    assert not any("none.md" in b for b in broken), broken


@pytest.mark.parametrize("heading, anchor", [
    ("Fencing a zombie: InitProducerId", "fencing-a-zombie-initproducerid"),
    ("read_committed and the last stable offset", "read_committed-and-the-last-stable-offset"),
    ("Checking it yourself: `oncelog audit`", "checking-it-yourself-oncelog-audit"),
    ("Parked transactions and two-phase commit (KIP-939)",
     "parked-transactions-and-two-phase-commit-kip-939"),
    ("A job boundary: the writer fence or a PREFIXED TRANSACTIONAL_ID ACL?",
     "a-job-boundary-the-writer-fence-or-a-prefixed-transactional_id-acl"),
    ("**Bold** and _emphasis_ [linked](x.md)", "bold-and-emphasis-linked"),
    ("The `__consumer_offsets` log", "the-__consumer_offsets-log"),
])
def test_slugs_are_githubs(heading, anchor):
    assert slug(heading) == anchor


_ROW_TEST = re.compile(r"`tests/([\w]+\.py)::(\w+)`")


def _decorators_of(source, name):
    """The decorators right above `def name(` in a test module, each as one
    string (a decorator written over several lines joined)."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"def {name}("):
            out, part = [], []
            j = i - 1
            while j >= 0 and (lines[j].startswith("@") or lines[j].startswith(" ")):
                part.insert(0, lines[j].strip())
                if lines[j].startswith("@"):
                    out.append(" ".join(part))
                    part = []
                j -= 1
            return out
    return None


def _runs_in_both_modes(decorator):
    """`@both_modes`, or a parametrization of the broker fixture that
    includes cluster mode."""
    return "both_modes" in decorator or (
        "broker_factory" in decorator and '"cluster"' in decorator and '"local"' in decorator)


def test_the_conformance_table_names_real_tests():
    rows = [l for l in (REPO_ROOT / "docs" / "conformance.md").read_text().splitlines()
            if l.startswith("| ") and "`tests/" in l]
    assert len(rows) >= 10
    both = 0
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for module, name in _ROW_TEST.findall(row):
            decorators = _decorators_of((REPO_ROOT / "tests" / module).read_text(), name)
            assert decorators is not None, f"docs/conformance.md names {module}::{name}, which does not exist"
            if len(cells) >= 4 and cells[2] == "yes" and cells[3] == "yes" and cells[1].startswith(f"`tests/{module}"):
                assert any(_runs_in_both_modes(d) for d in decorators), \
                    f"{module}::{name} is said to hold in both modes but is not a @both_modes test"
                both += 1
    assert both >= 10
