"""docs/hacking.md's claims about the package's imports and files stay true.

The table under "Who imports whom" is the one list of import rules: every row is parsed and checked
against the imports of every module under mars/ (read with `ast`, so nothing is imported and no torch is
needed: top-level and function-level imports, relative ones resolved, `importlib.import_module` of a
literal name). A row added to the table is checked as written. The file paths the page names as where
something lives today must exist, and its "no import line to add" for a new optimizer module holds.
The "files touched before" column of the change paths is the package at a past commit, not checked.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "hacking.md"
MARS = ROOT / "mars"
SHARED = "mars/*.py"  # the table's name for every module directly in mars/
TABLE_HEADING = "## Who imports whom"
NAME = re.compile(r"`([^`]+)`")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module under mars/ by its dotted name (a package by its __init__.py)."""
    return {module_name(p): p for p in sorted(MARS.rglob("*.py"))}


def resolve(name: str) -> str:
    """The module an imported name lives in: `mars.checks` for `from mars import checks`, else the
    longest prefix of `name` that is a module or package of mars."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules():
            return ".".join(parts[:end])
    return name


@cache
def imports_of(module: str) -> tuple[tuple[int, str], ...]:
    """(line, module) of every mars module `module` imports, wherever in the file the import is."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            # `from P import m` imports the module P.m when there is one, else names of P
            names = [f"{source}.{a.name}" for a in node.names if a.name != "*"] or [source]
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names = [arg.value]
        found += [(node.lineno, resolve(n)) for n in names if n == "mars" or n.startswith("mars.")]
    return tuple(found)


def shared_modules() -> list[str]:
    """The modules directly in mars/, its __init__.py (`mars`) among them."""
    return [m for m, p in modules().items() if p.parent == MARS]


def packages() -> list[str]:
    return [m for m, p in modules().items() if p.name == "__init__.py" and p.parent.parent == MARS]


def owner(module: str) -> str:
    """The table's unit a module belongs to: its top-level package, else SHARED."""
    top = ".".join(module.split(".")[:2])
    return top if top in packages() else SHARED


def table() -> list[tuple[str, list[str]]]:
    """(package or SHARED, the names its row allows) of each row, in the page's order."""
    text = PAGE.read_text(encoding="utf-8")
    assert TABLE_HEADING in text, f"docs/hacking.md lost its section {TABLE_HEADING!r}"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # after header, rule
    parsed = []
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 2, f"docs/hacking.md: a row of {TABLE_HEADING!r} is not two cells: {line}"
        subject = NAME.findall(cells[0])
        assert len(subject) == 1, f"docs/hacking.md: one package or module per row: {line}"
        parsed.append((subject[0], NAME.findall(cells[1])))
    assert parsed, f"docs/hacking.md: no rows under {TABLE_HEADING!r}"
    return parsed


RULES = table()


def allowed(module: str, rule: list[str]) -> bool:
    return any(
        owner(module) == SHARED if name == SHARED else module == name or module.startswith(f"{name}.")
        for name in rule
    )


def test_the_table_names_existing_packages_in_an_order_without_cycles():
    above: list[str] = []
    for subject, rule in RULES:
        assert subject == SHARED or subject in packages() or subject in shared_modules(), (
            f"docs/hacking.md names {subject}, which is no package or module of mars"
        )
        assert subject not in above, f"docs/hacking.md has two rows for {subject}"
        for name in rule:
            assert name in above or name == subject == SHARED, (
                f"docs/hacking.md: the row of {subject} names {name}, which is not a row above it: the "
                "imports would not run one way"
            )
        above.append(subject)


def test_every_package_and_shared_module_has_a_row():
    subjects = {s for s, _ in RULES}
    missing = [p for p in packages() if p not in subjects]
    if SHARED not in subjects:
        missing += [m for m in shared_modules() if m not in subjects]
    assert not missing, f"docs/hacking.md's table {TABLE_HEADING!r} has no row for {', '.join(missing)}"


@pytest.mark.parametrize("subject,rule", RULES, ids=[s for s, _ in RULES])
def test_the_imports_keep_the_rule(subject, rule):
    if subject == SHARED:
        covered = [m for m in shared_modules() if m not in {s for s, _ in RULES}]
    else:
        covered = [m for m in modules() if m == subject or m.startswith(f"{subject}.")]
    assert covered, f"docs/hacking.md has a row for {subject}, which holds no module"
    broken = [
        f"{modules()[m].relative_to(ROOT)}:{line} imports {target}"
        for m in covered
        for line, target in imports_of(m)
        if target != "mars" and owner(target) != owner(m) and not allowed(target, rule)
    ]
    assert not broken, (
        f"docs/hacking.md says {subject} may import only {', '.join(rule) or 'nothing of mars'}, but "
        + "; ".join(broken)
        + f" (move the code, or change the table under {TABLE_HEADING!r} if the design changed)"
    )


def test_the_walk_sees_every_kind_of_import():
    """The rules would hold vacuously if the walk missed imports: it sees a relative import, one inside
    a function, and `from mars import MODULE` as that module."""
    seen = {t for m in modules() for _, t in imports_of(m)}
    assert {"mars.checks", "mars.optim.adamw", "mars.checkpoint.lineage"} <= seen
    inner = imports_of("mars.analysis.runs")
    top = ast.parse(modules()["mars.analysis.runs"].read_text(encoding="utf-8")).body
    top_lines = {n.lineno for n in top if isinstance(n, ast.Import | ast.ImportFrom)}
    assert any(t == "mars.checkpoint.lineage" and line not in top_lines for line, t in inner)


# ----------------------------------------------------------------------------- files it names


def before_column_cells() -> set[str]:
    """The "files touched before" cells of the change-path table: the package at a past commit, not
    a claim about today's files."""
    text = PAGE.read_text(encoding="utf-8")
    cells = set()
    for line in text.splitlines():
        if line.startswith("| a new "):
            cells.add([c.strip() for c in line.strip().strip("|").split("|")][2])
    assert cells, "docs/hacking.md: the change-path table was not found"
    return cells


def named_files() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # code blocks: a plugin's own files
    for cell in before_column_cells():
        text = text.replace(cell, "")
    return sorted({n for n in NAME.findall(text) if re.fullmatch(r"[\w/]+\.py", n)})


@pytest.mark.parametrize("name", named_files())
def test_a_named_file_exists(name):
    places = [ROOT / name, MARS / name, ROOT / "scripts" / name]
    found = any(p.is_file() for p in places) or ("/" not in name and any(MARS.rglob(name)))
    assert found, f"docs/hacking.md names `{name}`, which is not a file of the repository"


# ----------------------------------------------------------------------------- the optimizer path


def test_a_new_optimizer_module_needs_no_import_line():
    """docs/hacking.md: "A module in `mars/optim/` is imported by the package on its own (no import line
    to add)", the "1 in the package" of a new optimizer's change path. mars/optim/__init__.py must
    import every public module it finds in its own folder (read, not run: no torch)."""
    text = PAGE.read_text(encoding="utf-8")
    assert "`mars/optim/` is imported by the package on its own" in " ".join(text.split())
    tree = ast.parse((MARS / "optim" / "__init__.py").read_text(encoding="utf-8"))
    loops = [
        n
        for n in tree.body
        if isinstance(n, ast.For)
        and isinstance(n.iter, ast.Call)
        and getattr(n.iter.func, "attr", getattr(n.iter.func, "id", "")) == "iter_modules"
        and any(isinstance(a, ast.Name) and a.id == "__path__" for a in n.iter.args)
    ]
    assert loops, "mars/optim/__init__.py no longer walks its own folder (pkgutil.iter_modules(__path__))"
    calls = [c for c in ast.walk(loops[0]) if isinstance(c, ast.Call)]
    assert any(getattr(c.func, "attr", getattr(c.func, "id", "")) == "import_module" for c in calls), (
        "mars/optim/__init__.py walks its folder but imports none of the modules it finds"
    )


FILES_HEADING = "## The packages, file by file"
ERRORS_HEADING = "## Errors"


def section(heading: str) -> str:
    text = PAGE.read_text(encoding="utf-8")
    assert heading in text, f"docs/hacking.md lost its section {heading!r}"
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def table_rows(text: str) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()]
    header = ("package", "class", "#", "private name")
    return [r for r in rows if len(r) > 1 and not set(r[0]) <= set("-: ") and r[0] not in header]


def test_the_file_counts_are_the_packages():
    """Each row's count is the number of .py files of that package; every package has a row."""
    counted = {}
    for name, count in table_rows(section(FILES_HEADING)):
        key = NAME.search(name).group(1)
        folder = MARS if key == SHARED else ROOT.joinpath(*key.split("."))
        counted[key] = (int(count), len(list(folder.glob("*.py"))))
    packages = {f"mars.{p.name}" for p in MARS.iterdir() if (p / "__init__.py").is_file()}
    assert set(counted) == packages | {SHARED}, "a package without a row, or a row of no package"
    wrong = {k: v for k, v in counted.items() if v[0] != v[1]}
    assert not wrong, f"docs/hacking.md says (files, actual): {wrong}"


def test_the_study_package_stays_readable_in_one_sitting():
    assert len(list((MARS / "study").glob("*.py"))) <= 10


def test_the_error_hierarchy_is_the_one_in_mars_errors():
    """Every class the Errors table names is defined in mars/errors.py with the status it says, and no
    module under mars/ defines another exception that a user sees: the only other exception classes are
    the control flow the page names."""
    from mars import errors

    for names, status, _ in table_rows(section(ERRORS_HEADING)):
        for name in NAME.findall(names):
            cls = getattr(errors, name)
            assert issubclass(cls, errors.UserError) and cls.status == int(status), name
    allowed = set(NAME.findall(section(ERRORS_HEADING)))
    found = []
    for path in MARS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, (ast.Name, ast.Attribute)) and ast.unparse(b).endswith(("Error", "Exception"))
                for b in node.bases
            ):
                found.append((module_name(path), node.name))
    stray = [
        f"{m}.{n}" for m, n in found if m != "mars.errors" and f"{m}.{n}" not in allowed and n not in allowed
    ]
    assert not stray, f"exception classes outside mars/errors.py that docs/hacking.md does not name: {stray}"


PATH_HEADING = "## The path of a value"


def test_the_path_of_gamma_names_files_that_hold_what_it_says():
    """Every file of the gamma path exists and holds each name the row gives it (`a.b` -> b); the rows
    count from 1."""
    rows = table_rows(section(PATH_HEADING))
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1))
    for _, name, what in rows:
        path = ROOT / NAME.search(name).group(1)
        assert path.is_file(), path
        text = path.read_text(encoding="utf-8")
        for symbol in NAME.findall(what):
            word = symbol.split(".")[-1].split("=")[0]
            assert word in text, f"{path.relative_to(ROOT)} does not hold {word} (docs/hacking.md: {symbol})"


def names_in_code(path: Path, word: str) -> bool:
    """Whether the code of `path` names `word`: in an identifier, or in a string constant that is a key
    (no spaces; docstrings and messages are prose, not code)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        for text in (getattr(node, a, None) for a in ("id", "attr", "arg", "name")):
            if isinstance(text, str) and word in text.lower():
                return True
        value = node.value if isinstance(node, ast.Constant) else None
        if isinstance(value, str) and word in value.lower() and not any(c.isspace() for c in value):
            return True
    return False


def test_no_file_off_the_path_of_gamma_names_it():
    """The path of gamma is complete: every file of mars/ whose code names gamma is a row of the table or
    one of the readers the section names after it."""
    text = section(PATH_HEADING)
    gamma = text[: text.index("`optimizer.lr` (")]
    named = {ROOT / n for n in NAME.findall(gamma) if n.startswith("mars/") and n.endswith(".py")}
    naming = {path for path in MARS.rglob("*.py") if names_in_code(path, "gamma")}
    assert naming, "the scan finds no file: it is broken"
    missing = sorted(str(p.relative_to(ROOT)) for p in naming - named)
    assert not missing, f"files whose code names gamma, not on docs/hacking.md's path of gamma: {missing}"


HYDRA_HEADING = "## What the harness takes from Hydra"


def private_hydra_names() -> dict[str, set[str]]:
    """Every `hydra._internal` name the code imports or names in a string, with the files it is in."""
    found: dict[str, set[str]] = {}
    files = [*MARS.rglob("*.py"), *(ROOT / "scripts").rglob("*.py"), *(ROOT / "eval").rglob("*.py")]
    for path in [*files, ROOT / "train.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hydra._internal"):
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("hydra._internal")]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value] if node.value.startswith("hydra._internal") else []
            for name in names:
                found.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_every_private_hydra_name_is_listed_with_where_it_is_used():
    """The table of private Hydra names is the code's, no more and no less, each in the files it gives."""
    rows = table_rows(section(HYDRA_HEADING))
    listed = {NAME.search(name).group(1): set(NAME.findall(where)) for name, where, _ in rows}
    found = private_hydra_names()
    assert found, "the walk found no private Hydra name: it no longer reads the code"
    assert listed == found, f"docs/hacking.md lists {listed}; the code uses {found}"
