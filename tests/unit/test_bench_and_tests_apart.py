"""bench/ and tests/ stay apart: no test imports a bench, no bench imports a test module, and
what both need lives in harness/, which imports neither. A bench imports only public names
of `app` (no `_private` module or name), so that no contract but the public one pins it.

Read from the source with `ast`; imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imports(path: Path) -> list[tuple[int, str, str]]:
    """Each import in a file: (line, module, name), name "" for `import module`."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
    return found


def importing(folder: Path, packages: tuple[str, ...]) -> list[str]:
    """`file:line module` for each import, in the .py files under `folder`, of a module in
    one of `packages` (the package itself, or `from package import x`)."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        for line, module, _ in imports(path):
            if module.split(".")[0] in packages:
                out.append(f"{path.relative_to(folder.parent)}:{line} {module}")
    return out


def private_app_names(folder: Path) -> list[str]:
    """`file:line module.name` for each `_private` module or name of `app` imported."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        for line, module, name in imports(path):
            if module.split(".")[0] != "app":
                continue
            parts = [*module.split("."), name] if name else module.split(".")
            if any(p.startswith("_") and not p.startswith("__") for p in parts):
                out.append(f"{path.relative_to(folder.parent)}:{line} {module}.{name}")
    return out


def test_no_test_imports_a_bench() -> None:
    assert importing(ROOT / "tests", ("bench",)) == []


def test_no_bench_imports_a_test_module() -> None:
    assert importing(ROOT / "bench", ("tests",)) == []


def test_harness_imports_neither_tests_nor_bench() -> None:
    assert importing(ROOT / "harness", ("tests", "bench")) == []


def test_benches_import_only_public_names_of_app() -> None:
    assert private_app_names(ROOT / "bench") == []
    assert private_app_names(ROOT / "harness") == []


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    folder = tmp_path / "bench"
    folder.mkdir()
    (folder / "a.py").write_text(
        "import tests.live\n"
        "def f():\n"
        "    from app.sheets.reading import _header, shown\n"
        "    from app._private import x\n"
        "    from bench.fleet import MODEL\n"
    )
    assert importing(folder, ("tests",)) == ["bench/a.py:1 tests.live"]
    assert importing(folder, ("bench",)) == ["bench/a.py:5 bench.fleet"]
    assert private_app_names(folder) == [
        "bench/a.py:3 app.sheets.reading._header",
        "bench/a.py:4 app._private.x",
    ]
