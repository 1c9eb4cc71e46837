"""The docs stay true to the code: every `batchyard` command in README.md and docs/ parses
with batchyard's own parser, the options page lists exactly `serve`'s flags, every relative
link leads to a file and a heading there, and every repo path named in the docs or in
app/'s docstrings and comments exists.

What counts as a repo path (`repo_paths`): a token that starts with one of the repo's
folders (`app/`, `bench/`, `harness/`, `tests/`, `docs/`, `packaging/`, `static/`, `templates/`,
`.ci/`) must exist from the repo's root, as a file or a folder; a token that ends in `.py`,
`.md` or `.sh` without such a start (`runner.py`, `engine/pool/berth.py`) must be
the end of some file's path in those folders or at the top. In Markdown only code is read:
inline code spans and fenced blocks; in app/ every docstring and comment. A token that
starts with `./` or `../` starts from the file's own folder; one that starts with `/` or
`~`, or holds `//` (absolute paths, URLs), is not the repo's.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import shlex
import tokenize
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

from app.cli import build_parser
from app.config import Settings
from app.engine.upstream import UPSTREAM_COMMAND
from app.toolchain.facts import SELFCHECK_COMMAND

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
#: The pages whose commands are checked: the front page and docs/.
COMMAND_PAGES = [ROOT / "README.md", *DOCS]
#: The pages whose links and paths are checked.
PAGES = [*COMMAND_PAGES, ROOT / "ARCHITECTURE.md", ROOT / "CONTRIBUTING.md"]
#: The repo's folders a path may start with, and the file endings a bare name may have.
FOLDERS = ("app", "bench", "harness", "tests", "docs", "packaging", "static", "templates", ".ci")
ENDINGS = ("py", "md", "sh")
#: The subcommands `batchyard` runs for itself in a frozen app, which `--help` does not list.
HIDDEN_COMMANDS = {UPSTREAM_COMMAND, SELFCHECK_COMMAND}
#: The fenced blocks whose lines are not shell: their `batchyard` words are not commands.
NOT_SHELL = {"python", "toml", "json", "jsonl"}
MAX_README_LINES = 250

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\[(?:[^\]]|\n)*?\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
PATH = re.compile(
    r"(?<![\w./~-])(?:"
    rf"(?:{'|'.join(re.escape(f) for f in FOLDERS)})/[\w./-]*"
    rf"|[\w./-]*\w\.(?:{'|'.join(ENDINGS)})(?!\w)"
    r")"
)


# -- reading Markdown -----------------------------------------------------------------------


def fences(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a page: (its language, its body)."""
    return [(m.group(1).strip().lower(), m.group(2)) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    """A page without its fenced blocks."""
    return FENCE.sub("", text)


def code_spans(text: str) -> list[str]:
    return CODE_SPAN.findall(prose(text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for m in HEADING.finditer(prose(text)):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


# -- commands -------------------------------------------------------------------------------


def shell_commands(body: str) -> Iterator[list[str]]:
    """Each `batchyard` command of a shell block as its arguments (after `batchyard`)."""
    body = body.replace("\\\n", " ")
    for line in body.splitlines():
        for segment in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(segment, comments=True)
            except ValueError:
                continue
            while words and (words[0] in {"RUN", "sudo", "exec"} or "=" in words[0]):
                words = words[1:]  # a Dockerfile's RUN, an env assignment before the command
            if words and (words[0] == "batchyard" or words[0].endswith("/batchyard")):
                yield words[1:]


def fenced_commands(text: str) -> list[list[str]]:
    return [
        argv
        for language, body in fences(text)
        if language not in NOT_SHELL
        for argv in shell_commands(body)
    ]


def inline_commands(text: str) -> list[list[str]]:
    """Code spans that are a `batchyard` command, often cut short (`batchyard run`)."""
    found = []
    for span in code_spans(text):
        words = span.split()
        if words and words[0] == "batchyard":
            found.append(words[1:])
    return found


def strict_parser() -> argparse.ArgumentParser:
    """batchyard's parser, taking each flag only as spelled in full: the docs spell flags in
    full, and `--node` for a `--node-name` renamed is a mistake, not an abbreviation."""
    parser = build_parser()
    todo = [parser]
    while todo:
        p = todo.pop()
        p.allow_abbrev = False
        todo += subparsers(p).values()
    return parser


def parse_problem(argv: list[str]) -> str | None:
    """Why `batchyard ARGV` would not start as written: the parser's error or the settings'
    refusal, without running anything. None when it parses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = strict_parser().parse_args(argv)
    except SystemExit as exc:
        return None if exc.code == 0 else err.getvalue().strip().splitlines()[-1]
    names = {f.name for f in fields(Settings)}
    try:
        Settings.load({k: v for k, v in vars(args).items() if k in names}, environ={})
    except ValueError as exc:
        return str(exc)
    return None


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def flag_problems(argv: list[str]) -> list[str]:
    """The subcommand words and `--flags` of a cut-short command that `batchyard` lacks."""
    parser = build_parser()
    words = list(argv)
    while words and not words[0].startswith("-"):
        choices = subparsers(parser)
        if not choices:
            break
        if words[0] not in choices:
            if words[0] in HIDDEN_COMMANDS:
                return []
            return [f"no subcommand {words[0]!r}"]
        parser = choices[words.pop(0)]
    known = set(parser._option_string_actions)
    return [
        f"no flag {w.split('=')[0]}"
        for w in words
        if w.startswith("--") and w.split("=")[0] not in known
    ]


# -- paths and links ------------------------------------------------------------------------


def repo_files(root: Path) -> set[str]:
    files = {p.name for p in root.iterdir() if p.is_file()}
    for folder in FOLDERS:
        base = root / folder
        if base.is_dir():
            files |= {
                p.relative_to(root).as_posix()
                for p in base.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts
            }
    return files


def repo_paths(text: str) -> list[str]:
    found = []
    for m in PATH.finditer(text):
        token = m.group(0).rstrip(".")
        if token.startswith(("/", "~")) or "//" in token or not token.strip("./"):
            continue
        found.append(token)
    return found


def missing_paths(
    tokens: list[str], root: Path, files: set[str], here: Path | None = None
) -> list[str]:
    """The tokens that name no file or folder of the repo; `here` is the folder that
    `./` and `../` start from."""
    missing = []
    for token in tokens:
        if token.startswith(("./", "../")):
            if not ((here or root) / token).exists():
                missing.append(token)
        elif token.split("/")[0] in FOLDERS:
            if not (root / token).exists():
                missing.append(token)
        elif not any(f == token or f.endswith("/" + token) for f in files):
            missing.append(token)
    return missing


def doc_paths(text: str) -> list[str]:
    """The repo paths a page names in code: its code spans and its fenced blocks."""
    code = [*code_spans(text), *(body for _, body in fences(text))]
    return [token for piece in code for token in repo_paths(piece)]


def comments_and_docstrings(source: str) -> list[str]:
    texts = [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(
            node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        ) and (doc := ast.get_docstring(node, clean=False)):
            texts.append(doc)
    return texts


def broken_links(page: Path, text: str) -> list[str]:
    broken = []
    for target in LINK.findall(prose(text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (
            anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text())
        ):
            broken.append(target)
    return broken


# -- the tests ------------------------------------------------------------------------------


def test_every_batchyard_command_in_a_fenced_block_parses() -> None:
    problems = {}
    count = 0
    for page in COMMAND_PAGES:
        for argv in fenced_commands(page.read_text()):
            count += 1
            if problem := parse_problem(argv):
                problems[f"{page.name}: batchyard {shlex.join(argv)}"] = problem
    assert problems == {}
    assert count >= 10  # the pages hold commands, and the reader found them


def test_every_flag_of_an_inline_batchyard_command_is_one_of_its_commands() -> None:
    problems = {
        f"{page.name}: batchyard {' '.join(argv)}": found
        for page in COMMAND_PAGES
        for argv in inline_commands(page.read_text())
        if (found := flag_problems(argv))
    }
    assert problems == {}


def test_the_options_page_lists_exactly_the_flags_of_serve() -> None:
    lines = (ROOT / "docs" / "options.md").read_text().splitlines()
    table = [line for line in lines if line.startswith("| `-")]
    listed = {flag for line in table for flag in re.findall(r"`(--[\w-]+)", line.split("|")[1])}
    serve = subparsers(build_parser())["serve"]
    flags = {f for f in serve._option_string_actions if f.startswith("--")} - {"--help"}
    assert sorted(listed - flags) == [], "listed, but not a flag of serve"
    assert sorted(flags - listed) == [], "a flag of serve the options page does not list"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_fenced_block_is_closed(page: Path) -> None:
    """An unclosed fence hides the commands after it from the checks here (and shows the
    rest of the page as code)."""
    text = page.read_text()
    opened = len(re.findall(r"^```", text, re.M))
    assert opened == 2 * len(fences(text))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file_and_its_heading(page: Path) -> None:
    assert broken_links(page, page.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_repo_path_a_page_names_exists(page: Path) -> None:
    found = missing_paths(doc_paths(page.read_text()), ROOT, repo_files(ROOT), page.parent)
    assert found == []


def test_every_repo_path_a_docstring_or_comment_in_app_names_exists() -> None:
    files = repo_files(ROOT)
    missing = {}
    for module in sorted((ROOT / "app").rglob("*.py")):
        texts = comments_and_docstrings(module.read_text())
        tokens = [t for text in texts for t in repo_paths(text)]
        if found := missing_paths(tokens, ROOT, files, here=module.parent):
            missing[module.relative_to(ROOT).as_posix()] = found
    assert missing == {}


def unread_variables(text: str, sources: str) -> list[str]:
    """The BATCHYARD_* variables a page names that neither a setting is read from nor any
    source of the repo names."""
    settings = {Settings.env_name(f.name) for f in fields(Settings)}
    named = sorted(set(re.findall(r"\bBATCHYARD_[A-Z0-9_]*[A-Z0-9]\b", text)))
    return [v for v in named if v not in settings and v not in sources]


def test_every_variable_the_pages_name_is_read() -> None:
    sources = "\n".join(
        p.read_text(errors="replace")
        for folder in ("app", "harness", "packaging", "tests")
        for p in sorted((ROOT / folder).rglob("*"))
        if p.is_file() and p.suffix in {".py", ".sh", ".spec"} and p != Path(__file__)
    )
    text = "\n".join(page.read_text() for page in PAGES)
    assert unread_variables(text, sources) == []
    assert unread_variables("`BATCHYARD_CTX_SIZE`, `BATCHYARD_NO_SUCH`", "") == [
        "BATCHYARD_NO_SUCH"
    ]


def test_the_readme_is_a_front_page_that_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= MAX_README_LINES
    blocks = [body.strip() for _, body in fences(readme)]
    assert blocks[0] == "bash install.sh && batchyard serve"  # install and start
    assert "bash tests/run.sh" in blocks  # the tests, as .ci/run runs them
    assert "exec bash tests/run.sh" in (ROOT / ".ci" / "run").read_text()
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(prose(readme))}
    assert [p.name for p in DOCS if p.resolve() not in linked] == []


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """Each check above on made-up pages that break its rule, so that each can fail."""
    page = (
        "# Top\n\n## A part: `x`\n\n"
        "```bash\nbatchyard serve --port 1 && batchyard serve --no-such-flag; batchyard serve --po 1\n"
        "RUN batchyard engine build --cuda --cuda-arch 90\n"
        "batchyard serve --engine gpu=openai:http://h/v1,concurrncy=4   # a typo\n```\n\n"
        "Run `batchyard run --no-such-flag` or `batchyard nothing`; `batchyard _upstream`.\n"
        "See [a part](#a-part-x), [no part](#nowhere), [gone](gone.md) and `app/gone.py`,\n"
        "`app/cli/parser.py`, `runner.py`, `engine/pool/berth.py`, `gone_too.py`, `~/x.py`, `../gone.md`.\n"
    )
    assert len(re.findall(r"^```", page, re.M)) == 2 * len(fences(page))
    unclosed = "```bash\nbatchyard serve\n\n```python\nprint()\n```\n"
    assert len(re.findall(r"^```", unclosed, re.M)) != 2 * len(fences(unclosed))
    commands = fenced_commands(page)
    assert commands[0] == ["serve", "--port", "1"] and parse_problem(commands[0]) is None
    assert "--no-such-flag" in (parse_problem(commands[1]) or "")
    assert "--po" in (parse_problem(commands[2]) or "")  # not taken for --port
    assert commands[3] == ["engine", "build", "--cuda", "--cuda-arch", "90"]
    assert "concurrncy" in (parse_problem(commands[4]) or "")
    assert [flag_problems(a) for a in inline_commands(page)] == [
        ["no flag --no-such-flag"],
        ["no subcommand 'nothing'"],
        [],
    ]
    (tmp_path / "page.md").write_text(page)
    assert broken_links(tmp_path / "page.md", page) == ["#nowhere", "gone.md"]
    assert missing_paths(doc_paths(page), ROOT, repo_files(ROOT), ROOT / "docs") == [
        "app/gone.py",
        "gone_too.py",
        "../gone.md",
    ]
    source = '"""Module (app/config.py).\n\nSee priority.py."""\n\n# app/cli/ (app/cli.py)\n'
    tokens = [t for text in comments_and_docstrings(source) for t in repo_paths(text)]
    assert sorted(missing_paths(tokens, ROOT, repo_files(ROOT))) == [
        "app/cli.py",
        "app/config.py",
        "priority.py",
    ]
