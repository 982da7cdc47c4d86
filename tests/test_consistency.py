"""What the documents say is what the tree and the code hold: links, paths, names, counts and defaults.

Every Markdown file of the project (README, docs/, deploy/, lab/, the fixtures' notes) and the docstrings
and comments of the package and the lab are read. Each check is a function of one text that returns what
it found wrong, so the mutation tests at the end can feed it a copy of a real document with one thing
broken (a link, an anchor, a path, a module, a count, a default) and see it reported. External links are
never fetched; they must be well-formed. The generated documents (docs/metrics.md, docs/configuration.md,
docs/runbooks) are compared with a fresh generation by tests/test_docs.py and tests/alerts/test_generated.py;
here, every document that says it is generated must be one of those.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import os
import re
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: directories that hold no document of ours: environments, caches, build and run outputs
SKIP_DIRS = frozenset(
    {".git", ".venv", "build", "dist", "node_modules", "out", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
)
#: the top-level directories a path in a document may start from
TOP_DIRS = ("benchmarks", "deploy", "docs", "examples", "lab", "src", "tests")
#: where a path named relative to a package (``localize/gpus.py``, ``_internal/faults.py``) may start
PACKAGE_BASES = (
    "src/trainhealth/_internal",
    "src/trainhealth",
    "src",
    "lab/src/trainhealth_lab",
    "lab/src",
)
#: the packages whose dotted names documents use, and where their source is
PACKAGES = {"trainhealth": ROOT / "src" / "trainhealth", "trainhealth_lab": ROOT / "lab" / "src" / "trainhealth_lab"}
#: paths of other projects that a document names beside the project it cites (the check: that name is there)
EXTERNAL_PATHS = {
    "docs/hardware/gpu.md": "open-telemetry/semantic-conventions",
}
NUMBER_WORDS = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}
_NUMBER = r"(\d{1,3}(?:,\d{3})+|\d+|" + "|".join(NUMBER_WORDS) + r")"


# --- the documents ----------------------------------------------------------------------------------------


def _walk(*suffixes: str) -> list[Path]:
    found = []
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = sorted(
            d
            for d in subdirs
            if d not in SKIP_DIRS and not d.endswith(".egg-info") and not d.startswith("trainhealth-demo")
        )
        found += [Path(directory) / name for name in files if name.endswith(suffixes)]
    return sorted(found)


@cache
def markdown_files() -> tuple[Path, ...]:
    return tuple(_walk(".md"))


@cache
def python_sources() -> tuple[Path, ...]:
    return tuple(p for p in _walk(".py") if p.is_relative_to(ROOT / "src") or p.is_relative_to(ROOT / "lab" / "src"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def python_prose(source: str) -> str:
    """The docstrings and comments of a Python module, one after another (the code itself left out)."""
    parts = [
        tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                parts.append(docstring)
    return "\n".join(parts)


def without_code_blocks(text: str) -> str:
    """The text with fenced code blocks blanked (line numbers kept)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


# --- (a) links and anchors ---------------------------------------------------------------------------------

_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\)")
_REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_AUTOLINK = re.compile(r"<(https?://[^>\s]+)>")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, links reduced to their text, punctuation dropped, spaces to
    hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    seen: dict[str, int] = {}
    for line in without_code_blocks(text).splitlines():
        heading = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def malformed_url(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
        return f"malformed link {url!r}"
    return None


def broken_links(text: str, doc: Path) -> list[str]:
    """Markdown links of ``text`` (the document at ``doc``) to a file or heading that is not there, or to a
    malformed URL."""
    prose = without_code_blocks(text)
    targets = [m.group(1) for m in _LINK.finditer(prose)]
    targets += _REFERENCE_LINK.findall(prose) + _AUTOLINK.findall(prose)
    problems = []
    for target in targets:
        if target.startswith(("http://", "https://")):
            if (bad := malformed_url(target)) is not None:
                problems.append(bad)
            continue
        if target.startswith("mailto:"):
            continue
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            problems.append(f"malformed link {target!r}")
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists() or not file.is_relative_to(ROOT):
            problems.append(f"link to a missing file: {target}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            problems.append(f"link to a missing heading: {target}")
    return problems


# --- (b) paths and dotted names ----------------------------------------------------------------------------

_PATH = re.compile(r"(?<![\w./<>{}:@$~-])((?:\./)?[\w.*-]+(?:/[\w.*<>{}$-]+)+/?)")
#: a project note named alone (``README.md``, ``CHANGELOG.md``): upper case by convention; lower-case documents are
#: named by their path or linked, and lower-case names alone are often outputs (``report.md``)
_BARE_MARKDOWN = re.compile(r"(?<![\w./<>{}:@$~-])([A-Z][A-Z0-9_-]*\.md)\b(?!/)")


def _exists(base: Path, path: str) -> bool:
    if any(c in path for c in "*?["):
        return any(base.glob(path))
    return (base / path).exists()


def _external(path: str, text: str, start: int) -> bool:
    project = EXTERNAL_PATHS.get(path)
    return project is not None and project in text[max(0, start - 300) : start + 300]


def missing_paths(text: str, doc: Path) -> list[str]:
    """Files and directories of this project that ``text`` (the document or module at ``doc``) names and the tree
    lacks: paths from the top (``docs/x.md``), beside the document (``runbooks/README.md``), in a package
    (``localize/gpus.py``), and bare Markdown names (``benchmarks.md``)."""
    problems = []
    for match in _PATH.finditer(text):
        path = match.group(1).rstrip(".,").removeprefix("./")
        if any(c in path for c in "<>{}$") or path.startswith(("../", "http")):
            continue
        first = path.split("/", 1)[0]
        bases = [ROOT] if first in TOP_DIRS else []
        bases += [doc.parent] if (doc.parent / first).is_dir() else []
        if path.endswith(".py") and any((ROOT / base / first).is_dir() for base in PACKAGE_BASES):
            bases += [ROOT / base for base in PACKAGE_BASES]
        if bases and not any(_exists(base, path) for base in bases) and not _external(path, text, match.start()):
            problems.append(f"names a path that is not in the tree: {path}")
    for match in _BARE_MARKDOWN.finditer(text):
        name = match.group(1)
        places = (doc.parent, ROOT, ROOT / "docs", ROOT / "docs" / "runbooks")
        if not any((place / name).is_file() for place in places) and not _external(name, text, match.start()):
            problems.append(f"names a document that is not in the tree: {name}")
    return problems


def _module_file(parts: list[str]) -> Path | None:
    base = PACKAGES[parts[0]].joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def module_names(file: Path) -> frozenset[str]:
    """What a module defines at its top level (in ``if`` and ``try`` blocks too), its ``__all__``, and for a
    package its submodules."""
    tree = ast.parse(file.read_text(encoding="utf-8"))
    names: set[str] = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                names |= set(ast.literal_eval(node.value))
        elif isinstance(node, (ast.If, ast.Try)):
            pending += node.body + node.orelse + getattr(node, "finalbody", [])
            pending += [n for handler in getattr(node, "handlers", []) for n in handler.body]
    if file.name == "__init__.py":
        names |= {p.stem for p in file.parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    return frozenset(names)


def resolves(dotted: str) -> bool:
    """Whether ``trainhealth.x.y.Name`` is a module of ours or a name one defines."""
    parts = dotted.split(".")
    for length in range(len(parts), 0, -1):
        file = _module_file(parts[:length])
        if file is not None:
            return length == len(parts) or parts[length] in module_names(file)
    return False


@cache
def _module_like() -> frozenset[str]:
    """Second parts of a dotted name that mean a module: the packages' own children and ``_internal``'s."""
    children = set()
    for root in (*PACKAGES.values(), PACKAGES["trainhealth"] / "_internal"):
        children |= {p.stem for p in root.iterdir() if (p.suffix == ".py" or (p / "__init__.py").exists())}
    return frozenset(children - {"__init__", "__main__"})


@cache
def _otel_names() -> frozenset[str]:
    from trainhealth._internal.catalog import CATALOG

    return frozenset(spec.otel_name for spec in CATALOG)


def unresolved_modules(text: str) -> list[str]:
    """Dotted names of our modules (``trainhealth._internal.demo.worker``, ``trainhealth_lab.scoring``) that no
    module or name of the tree answers; OpenTelemetry metric names (``trainhealth.sdc.suspect``) are not modules."""
    problems = []
    for match in re.finditer(r"(?<![\w.])(trainhealth(?:_lab)?(?:\.[A-Za-z_]\w*)+)", text):
        dotted = match.group(1)
        parts = dotted.split(".")
        if parts[1] not in _module_like() or any(name.startswith(dotted) for name in _otel_names()):
            continue
        if not resolves(dotted):
            problems.append(f"names a module or name that is not in the tree: {dotted}")
    return problems


# --- (c) counts --------------------------------------------------------------------------------------------


def stated_counts(text: str, pattern: str) -> list[int]:
    """The numbers ``pattern`` states (``{n}`` is where the number stands: ``"{n} dashboards"``)."""
    regex = re.compile(r"(?<![\w.])" + pattern.replace("{n}", _NUMBER) + r"\b", re.I)
    return [_number(m.group(1)) for m in regex.finditer(" ".join(text.split()))]


def _number(word: str) -> int:
    return NUMBER_WORDS[word.lower()] if word.lower() in NUMBER_WORDS else int(word.replace(",", ""))


def wrong_counts(text: str, pattern: str, actual: int) -> list[str]:
    return [
        f"says {pattern.replace('{n}', str(n))!r}; the code has {actual}"
        for n in stated_counts(text, pattern)
        if n != actual
    ]


@dataclass(frozen=True)
class CountClaim:
    """A count that prose states, where (file names relative to the root; empty: every document), and its value."""

    pattern: str
    actual: Callable[[], int]
    files: tuple[str, ...] = ()


def _alerts() -> tuple:
    from trainhealth._internal.alerts.rules import ALERTS

    return tuple(ALERTS)


def _dashboards() -> int:
    from trainhealth._internal.dashboards.render import DASHBOARDS

    return len(DASHBOARDS)


@cache
def public_surface() -> dict[str, tuple[str, ...]]:
    """Each public module (no part of its path starts with ``_``) and its ``__all__``, read from its source."""
    surface = {}
    for file in sorted(PACKAGES["trainhealth"].rglob("*.py")):
        parts = ("trainhealth", *file.relative_to(PACKAGES["trainhealth"]).with_suffix("").parts)
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if not any(part.startswith("_") for part in parts):
            tree = ast.parse(file.read_text(encoding="utf-8"))
            declared = [
                ast.literal_eval(node.value)
                for node in tree.body
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
            ]
            surface[".".join(parts)] = tuple(declared[0]) if declared else ()
    return surface


def public_names(module: str | None = None) -> int:
    """How many names the public modules (or ``module``) export, dunders (``__version__``) left out."""
    modules = [module] if module is not None else list(public_surface())
    return sum(1 for name_of in modules for name in public_surface()[name_of] if "__" not in name)


COUNT_CLAIMS = (
    CountClaim("{n} (?:alert )?rules", lambda: len(_alerts()), ("README.md", "docs/alerting.md")),
    CountClaim("{n} alert rules", lambda: len(_alerts())),
    CountClaim("rules in {n} groups", lambda: len({rule.group for rule in _alerts()})),
    CountClaim("{n} runbooks", lambda: len(_alerts())),
    CountClaim("{n} dashboards", _dashboards),
    CountClaim("re-export {n} names", public_names),
    CountClaim("`trainhealth.catalog` re-exports {n} names", lambda: public_names("trainhealth.catalog")),
)


# --- (d) defaults ------------------------------------------------------------------------------------------


def _ports() -> dict[str, int]:
    from trainhealth._internal.cli.localize import ANALYZER_PORT
    from trainhealth._internal.cli.main import NODE_EXPORTER_PORT
    from trainhealth._internal.config.groups import DEFAULT_PROMETHEUS_PORT_BASE

    return {"rank": DEFAULT_PROMETHEUS_PORT_BASE, "node": NODE_EXPORTER_PORT, "analyzer": ANALYZER_PORT}


#: how prose states each default port: a rank's (``9450 + local rank``), the node exporter's, the analyzer's
PORT_CLAIMS = {
    "rank": (
        r"(\d{4,5})\s*\+\s*`?(?:LOCAL_RANK|local[_ ]rank)",
        r"127\.0\.0\.1:(\d{4,5})(?:-\d{4,5}/|\+r\b)",
        r"\bmetrics on :(\d{4,5})",  # an example's comment: the Monitor's endpoint
    ),
    "node": (r"`trainhealth export`[^.]{0,100}?\bport (\d{4,5})",),
    "analyzer": (
        r"(?:analy[sz]\w*|suspect\w*)[^.|]{0,120}?(?:default port |serves :|on :|at `:|on `127\.0\.0\.1:)(\d{4,5})",
    ),
}


def stated_ports(text: str) -> dict[str, list[int]]:
    return {
        which: [int(m.group(1)) for pattern in patterns for m in re.finditer(pattern, text)]
        for which, patterns in PORT_CLAIMS.items()
    }


def wrong_ports(text: str) -> list[str]:
    ports = _ports()
    return [
        f"says the {which} port is {port}; the default is {ports[which]}"
        for which, stated in stated_ports(text).items()
        for port in stated
        if port != ports[which]
    ]


@cache
def _setting_defaults() -> dict[str, object]:
    from trainhealth._internal.config import setting_infos

    return {info.name: info.default for info in setting_infos()}


@cache
def _threshold_defaults() -> dict[str, object]:
    from trainhealth._internal.localize.candidates import Thresholds

    return {f.name: f.default for f in dataclasses.fields(Thresholds)}


def _same(stated: str, default: object) -> bool:
    number = re.match(r"\s*(-?\d+(?:\.\d+)?)\s*(%)?", stated)
    if number is None or isinstance(default, bool) or not isinstance(default, (int, float)):
        return True  # not a number this check reads
    value = float(number.group(1)) / (100 if number.group(2) else 1)
    return abs(value - float(default)) <= 1e-9 * max(1.0, abs(float(default)))


def wrong_defaults(text: str) -> list[str]:
    """Defaults of settings and localizer thresholds that prose or a ``| setting | default |`` table states
    differently from the code."""
    settings, thresholds = _setting_defaults(), _threshold_defaults()
    problems = []
    for name, stated in re.findall(r"`(\w+)`[^`.;]{0,40}?\(default (-?[\d.]+%?)", text):
        if name in settings and not _same(stated, settings[name]):
            problems.append(f"says {name} defaults to {stated}; the code has {settings[name]}")
    for row in _table_rows(text, "setting", "default"):
        names = [n for n in re.findall(r"`([a-z_]+)`", row[0])]
        values = [part for part in row[1].split(", ")]
        if len(names) != len(values):
            continue
        for name, stated in zip(names, values):
            default = thresholds.get(name, settings.get(name))
            if default is not None and not _same(stated, default):
                problems.append(f"says {name} defaults to {stated}; the code has {default}")
    stated_spec = re.search(r"The default:\s*```\n(.*?)```", text, flags=re.S)
    if stated_spec is not None and "".join(stated_spec.group(1).split()) != settings["detectors"]:
        problems.append("the default detectors setting in the text is not the code's")
    return problems


def _table_rows(text: str, *columns: str) -> Iterator[list[str]]:
    """The cells of ``columns`` in every row of every table whose header has those columns."""
    index: list[int] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            index = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if index is None:
            index = [cells.index(c) for c in columns] if all(c in cells for c in columns) else []
        elif index and not set(line) <= set("|-: "):
            yield [cells[i] for i in index]


# --- the tests ---------------------------------------------------------------------------------------------


def _markdown_ids() -> list[str]:
    return [_rel(p) for p in markdown_files()]


def test_the_documents_are_found():
    found = set(_markdown_ids())
    assert {"README.md", "docs/api.md", "docs/runbooks/README.md"} <= found
    assert not any(p.startswith((".venv/", "build/")) for p in found)
    assert len(python_sources()) > 100


@pytest.mark.parametrize("doc", _markdown_ids())
def test_a_document_links_only_to_what_is_there(doc):
    path = ROOT / doc
    assert broken_links(path.read_text(encoding="utf-8"), path) == []


@pytest.mark.parametrize("doc", _markdown_ids())
def test_a_document_names_only_paths_and_modules_that_are_there(doc):
    path = ROOT / doc
    text = path.read_text(encoding="utf-8")
    modules = [] if doc == "docs/metrics.md" else unresolved_modules(text)  # metrics.md: OpenTelemetry names
    assert missing_paths(text, path) + modules == []


def test_docstrings_and_comments_name_only_paths_and_modules_that_are_there():
    problems = []
    for path in python_sources():
        prose = python_prose(path.read_text(encoding="utf-8"))
        problems += [f"{_rel(path)}: {p}" for p in missing_paths(prose, path)]
        problems += [f"{_rel(path)}: {p}" for p in unresolved_modules(prose)]
    assert problems == []


def test_stated_counts_are_the_code_s():
    problems, stated = [], set()
    for path in markdown_files():
        text = path.read_text(encoding="utf-8")
        for claim in COUNT_CLAIMS:
            if claim.files and _rel(path) not in claim.files:
                continue
            if stated_counts(text, claim.pattern):
                stated.add(claim.pattern)
            problems += [f"{_rel(path)}: {p}" for p in wrong_counts(text, claim.pattern, claim.actual())]
    assert problems == []
    # each claim the documents make today is still read (the other two guard sentences yet to be written)
    assert {c.pattern for c in COUNT_CLAIMS} - {"{n} alert rules", "{n} runbooks"} <= stated


def test_there_is_a_runbook_per_alert():
    runbooks = {p.stem for p in (ROOT / "docs" / "runbooks").glob("*.md")} - {"README"}
    assert runbooks == {rule.name for rule in _alerts()}


def test_stated_defaults_are_the_code_s():
    problems, ports_stated = [], {which: 0 for which in PORT_CLAIMS}
    for path in markdown_files():
        text = path.read_text(encoding="utf-8")
        problems += [f"{_rel(path)}: {p}" for p in wrong_ports(text) + wrong_defaults(text)]
        for which, stated in stated_ports(text).items():
            ports_stated[which] += len(stated)
    assert problems == []
    assert all(ports_stated.values()), ports_stated  # each port pattern still reads a sentence of the docs


def test_every_document_marked_generated_is_checked_against_its_generator():
    from trainhealth._internal.cli.docgen import GENERATED_DOCS

    marked = {_rel(p) for p in markdown_files() if "<!-- Generated by" in p.read_text(encoding="utf-8")}
    assert marked - set(GENERATED_DOCS) == {
        _rel(p) for p in (ROOT / "docs" / "runbooks").glob("*.md")
    }  # the runbooks: tests/alerts/test_generated.py


def test_every_advice_source_is_a_titled_link():
    from trainhealth._internal.knowledge.advice import ADVICE, Source, known_xid_advice

    sources = {s for advice in ADVICE.values() for s in advice.sources} | {x.source for x in known_xid_advice()}
    assert sources and all(s.title and malformed_url(s.url) is None for s in sources)
    assert broken_links("\n".join(f"- {s}" for s in sources), ROOT / "docs" / "runbooks" / "README.md") == []
    with pytest.raises(ValueError, match="https:// link"):
        Source(_NOWHERE + " mitigation catalogue", "")


# --- each check fails when its fact is broken (mutations of real documents) ---------------------------------


#: documents the project once cited and does not have (spelled in parts, so that a search of the tree for them
#: finds none)
_NOWHERE, _OLD_FORMAT = "REFERENCE" + ".md", "TRACE_FORMAT" + ".md"


def _read(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def _mutated(doc: str, old: str, new: str) -> str:
    text = _read(doc)
    assert old in text, f"{doc} no longer says {old!r}: update the mutation"
    return text.replace(old, new, 1)


def test_a_broken_link_path_or_anchor_is_reported():
    readme = ROOT / "README.md"
    assert broken_links(_mutated("README.md", "(docs/stack.md)", "(docs/stacks.md)"), readme) == [
        "link to a missing file: docs/stacks.md"
    ]
    mutated = _mutated("README.md", "#demo-runs-issue-19)", "#demo-runs-issue-91)")
    assert broken_links(mutated, readme) == ["link to a missing heading: docs/benchmarks.md#demo-runs-issue-91"]
    assert broken_links(_read("README.md") + "\n[x](https:/example.org)\n", readme) == [
        "malformed link 'https:/example.org'"
    ]


def test_a_wrong_path_or_document_name_is_reported():
    alerting = ROOT / "docs" / "alerting.md"
    mutated = _mutated("docs/alerting.md", "`tests/alerts/test_generated.py`", "`tests/alerts/test_generate.py`")
    assert missing_paths(mutated, alerting) == ["names a path that is not in the tree: tests/alerts/test_generate.py"]
    mutated = _mutated("docs/alerting.md", "[runbooks/README.md]", "[runbooks/READ.md]")
    assert missing_paths(mutated, alerting) == ["names a path that is not in the tree: runbooks/READ.md"]
    mutated = _mutated("docs/architecture.md", "`exporters/step_observer.py`", "`exporters/step_observers.py`")
    assert missing_paths(mutated, ROOT / "docs" / "architecture.md") == [
        "names a path that is not in the tree: exporters/step_observers.py"
    ]
    advice = ROOT / "src/trainhealth/_internal/knowledge/advice.py"
    prose = python_prose(advice.read_text(encoding="utf-8")) + f"\n# see {_NOWHERE} and docs/{_OLD_FORMAT}\n"
    assert missing_paths(prose, advice) == [
        f"names a path that is not in the tree: docs/{_OLD_FORMAT}",
        f"names a document that is not in the tree: {_NOWHERE}",
    ]
    gpu = ROOT / "src/trainhealth/_internal/catalog/gpu.py"
    prose = python_prose(gpu.read_text(encoding="utf-8"))
    assert "docs/hardware/gpu.md" in prose and missing_paths(prose, gpu) == []
    assert missing_paths(prose.replace("open-telemetry/semantic-conventions", "its repository"), gpu) != []


def test_a_module_that_is_gone_is_reported():
    mutated = _mutated(
        "docs/detectors.md", "`src/trainhealth/_internal/demo/worker.py`", "`trainhealth.demo.worker.DEMO_DETECTORS`"
    )
    assert unresolved_modules(mutated) == [
        "names a module or name that is not in the tree: trainhealth.demo.worker.DEMO_DETECTORS"
    ]
    assert unresolved_modules("`trainhealth._internal.demo.worker.DEMO_DETECTORS`, `trainhealth.Monitor`") == []
    assert unresolved_modules("`trainhealth._internal.demo.worker.DEMO_DETECTOR`") != []
    assert unresolved_modules("`trainhealth_lab.scoring.BLAME_SCORE`, `trainhealth.sdc.suspect`") == []


@pytest.mark.parametrize(
    ("doc", "old", "new"),
    [
        ("README.md", "# 29 rules as", "# 27 rules as"),
        ("docs/alerting.md", "29 rules in three groups", "29 rules in four groups"),
        ("docs/alerting.md", "Four dashboards", "Five dashboards"),
        ("docs/architecture.md", "re-export 44 names", "re-export 45 names"),
        ("docs/architecture.md", "re-exports six names", "re-exports seven names"),
    ],
)
def test_a_wrong_count_is_reported(doc, old, new):
    claims = [c for c in COUNT_CLAIMS if not c.files or doc in c.files]
    assert not any(wrong_counts(_read(doc), c.pattern, c.actual()) for c in claims)
    assert any(wrong_counts(_mutated(doc, old, new), c.pattern, c.actual()) for c in claims)


@pytest.mark.parametrize(
    ("doc", "old", "new", "problem"),
    [
        ("docs/api.md", "port 9450 + local rank", "port 9400 + local rank", "the rank port is 9400"),
        ("docs/api.md", "# /metrics on port 9450 + local rank", "# metrics on :9400", "the rank port is 9400"),
        ("README.md", "127.0.0.1:9450-9453/metrics", "127.0.0.1:9400-9403/metrics", "the rank port is 9400"),
        ("docs/dcgm.md", "(`trainhealth export`, port 9449)", "(`trainhealth export`, port 9400)", "node port is 9400"),
        ("docs/localization.md", "(default port 9448;", "(default port 9090;", "the analyzer port is 9090"),
        ("README.md", "`stats_every` steps (default 20)", "`stats_every` steps (default 50)", "stats_every defaults"),
        ("docs/localization.md", "| `gpu_z` (`--gpu-z`) | 7 |", "| `gpu_z` (`--gpu-z`) | 8 |", "gpu_z defaults"),
        ("docs/localization.md", "| 3, 1% |", "| 3, 5% |", "false_blame defaults to 5%"),
        ("docs/detectors.md", "zscore(direction=up,threshold=12)", "zscore(direction=up,threshold=10)", "detectors"),
    ],
)
def test_a_wrong_default_is_reported(doc, old, new, problem):
    assert wrong_ports(_read(doc)) + wrong_defaults(_read(doc)) == []
    problems = wrong_ports(_mutated(doc, old, new)) + wrong_defaults(_mutated(doc, old, new))
    assert len(problems) == 1 and problem in problems[0], problems
