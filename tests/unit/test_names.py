"""One word, one meaning, as far as a parser can tell: no two classes in app/ share a name, and
no constant is written twice (one name, one value, in two modules: a rule with two homes)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"


def modules(top: Path) -> list[tuple[str, ast.Module]]:
    """Each module under `top` (migrations aside: revisions are frozen history), parsed."""
    return [
        (str(p.relative_to(top.parent)), ast.parse(p.read_text()))
        for p in sorted(top.rglob("*.py"))
        if "migrations" not in p.relative_to(top).parts
    ]


def shared_class_names(top: Path) -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path, tree in modules(top):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                by_name[node.name].append(path)
    return {name: paths for name, paths in by_name.items() if len(paths) > 1}


def twice_written_constants(top: Path) -> dict[str, list[str]]:
    """UPPER_CASE module constants of one name and one literal value in two modules."""
    by_key: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path, tree in modules(top):
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if not (isinstance(target, ast.Name) and target.id.isupper()):
                continue
            try:
                literal = repr(ast.literal_eval(value))
            except ValueError:
                continue  # computed: a router's handlers, a compiled pattern
            by_key[(target.id, literal)].append(path)
    return {f"{name} = {value}": paths for (name, value), paths in by_key.items() if len(paths) > 1}


def test_no_two_classes_in_app_share_a_name() -> None:
    assert shared_class_names(APP) == {}


def test_no_constant_is_written_in_two_modules() -> None:
    assert twice_written_constants(APP) == {}


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    top = tmp_path / "app"
    (top / "migrations").mkdir(parents=True)
    (top / "one.py").write_text("class Model:\n    pass\n\nLIMIT = 8\nLOOKUP = dict(a=1)\n")
    (top / "two.py").write_text("class Model:\n    pass\n\nLIMIT = 8\nLOOKUP = dict(a=1)\n")
    (top / "three.py").write_text("class Other:\n    pass\n\nLIMIT = 9\n")
    (top / "migrations" / "rev.py").write_text("class Other:\n    pass\n\nLIMIT = 9\n")
    assert shared_class_names(top) == {"Model": ["app/one.py", "app/two.py"]}
    assert twice_written_constants(top) == {"LIMIT = 8": ["app/one.py", "app/two.py"]}
