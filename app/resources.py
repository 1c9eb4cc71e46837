"""Where the templates and static files are: inside the installed package, or the repo."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).parent


def _find(name: str) -> Path:
    # The wheel carries them inside the package (pyproject force-include); a checkout has
    # them at the top level beside app/.
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


def templates_dir() -> Path:
    return _find("templates")


def static_dir() -> Path:
    return _find("static")
