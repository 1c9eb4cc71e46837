"""The architecture as a test: the import contracts in pyproject.toml hold (layers, only
engine/llama imports llama_cpp, wire is a leaf, only the server imports api/ and web/, the
runner and the API see the engines through engine/base and engine/node alone), they fail
when someone breaks them, no module of the app imports itself back through others, and no
folder of the app holds more than 12 modules flat."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The most modules (`*.py`, `__init__.py` too) one folder of app/ holds flat: past that,
#: sub-packages show how its modules group.
MAX_FLAT_MODULES = 12
LINT_IMPORTS = [
    sys.executable,
    "-c",
    "from importlinter.cli import lint_imports_command; lint_imports_command()",
]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LINT_IMPORTS, "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_import_contract_is_kept() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("app/wire/files.py", "import app.engine.base", "app.wire imports nothing of the app"),
        (
            "app/batches/lifecycle/output.py",
            "import app.api.files",
            "Only app.server imports app.api",
        ),
        ("app/api/files.py", "import llama_cpp", "Only app.engine.llama imports llama_cpp"),
        (
            "app/toolchain/facts.py",
            "import app.engine.llama.binding.native",
            "Each layer imports only",
        ),
        (
            "app/engine/llama/contexts/slots.py",
            "import app.engine.upstream.kinds.openai",
            "The two engines and the OpenAI",
        ),
        # Past the Engine contract: the API asking the registry itself, the runner the pool.
        ("app/api/inference.py", "import app.engine.registry", "The runner and the API see"),
        ("app/batches/__init__.py", "import app.engine.pool.pool", "The runner and the API see"),
        ("app/engine/registry.py", "import app.engine.node", "The two engines and the OpenAI"),
    ],
)
def test_a_contract_fails_when_an_import_breaks_it(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    shutil.copytree(ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / module, "a", encoding="utf-8") as fh:
        fh.write(f"\n{line}  # noqa\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    broken = [row for row in done.stdout.splitlines() if row.endswith("BROKEN")]
    assert any(row.startswith(contract) for row in broken), done.stdout


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The groups of modules that import one another round in a circle (Tarjan's SCCs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_module_imports_itself_back_through_others() -> None:
    # Imports inside functions count too: a lazy import still ties two rooms together.
    graph = grimp.build_graph("app", cache_dir=None)
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "ring"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from ring import b\n")
    (pkg / "b.py").write_text("def f():\n    from ring import c\n")
    (pkg / "c.py").write_text("import ring.a\n")
    (pkg / "d.py").write_text("import ring.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("ring", cache_dir=None)
    assert import_cycles(graph) == [["ring.a", "ring.b", "ring.c"]]


def crowded(app: Path) -> dict[str, int]:
    """The folders of `app` (itself too) that hold more than MAX_FLAT_MODULES modules flat,
    each with its count, named from app's parent."""
    folders = [app, *(d for d in app.rglob("*") if d.is_dir() and "__pycache__" not in d.parts)]
    counts = {d.relative_to(app.parent).as_posix(): len(list(d.glob("*.py"))) for d in folders}
    return {d: n for d, n in sorted(counts.items()) if n > MAX_FLAT_MODULES}


def test_no_folder_of_the_app_holds_more_than_12_modules_flat() -> None:
    assert crowded(ROOT / "app") == {}


def test_the_folder_count_sees_a_crowded_folder(tmp_path: Path) -> None:
    """The check on a made-up tree: 13 modules flat are too many, in app/ or deeper, while
    12, or 13 spread over a folder and its sub-package, are not; other files do not count."""
    app = tmp_path / "app"
    for folder, n in (("", 13), ("full", 12), ("deep/er", 13), ("split", 7), ("split/sub", 6)):
        (app / folder).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (app / folder / f"m{i}.py").touch()
    (app / "full" / "notes.md").touch()
    (app / "full" / "__pycache__").mkdir()
    for i in range(13):
        (app / "full" / "__pycache__" / f"m{i}.py").touch()
    assert crowded(app) == {"app": 13, "app/deep/er": 13}
