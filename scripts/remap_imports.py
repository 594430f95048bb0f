#!/usr/bin/env python3
"""Rewrite module references after modules moved: imports, strings, config files, paths.

    python scripts/remap_imports.py [MAP ...]      default: every docs/moves-*.txt

A map has one move per line, ``old -> new``; ``#`` starts a comment. Two kinds:

    sharder.plan -> sharder.engine.planning                 a module (or package) moved
    sharder.spec:StrictModel -> sharder.kernel.models:StrictModel   one name moved module

What it rewrites, across the tree (``.venv``, ``.git`` and ``node_modules`` skipped):

* Python imports, through the AST: ``import old``, ``from old import x``, ``from pkg import
  old_leaf`` (a moved module imported from its package; ``as`` is dropped when it named the
  new leaf, added when the leaf was renamed), and ``from m import a, b`` split in two when
  ``a`` and ``b`` now live in different modules;
* any other mention of a dotted name (docstrings, ``mock.patch("old.f")``, ``"old:app"``,
  ``python -m old``) and of its path (``sharder/plan.py``) in ``.py``, ``.md``, ``.toml``,
  ``.importlinter``, ``.sh``, ``.yml``, ``.yaml``, ``.cfg``, ``.ini`` and ``Dockerfile``.

Idempotent: a second run changes nothing, because no new name starts with the old one at a
name boundary. It does not follow namespace use (``output.build_bundle`` after ``from
sharder import output`` when ``build_bundle`` alone moved): mypy names those.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".venv", ".git", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache", "out"}
TEXT = {".py", ".md", ".toml", ".importlinter", ".sh", ".yml", ".yaml", ".cfg", ".ini"}


def read_map(paths: list[Path]) -> tuple[dict[str, str], dict[tuple[str, str], tuple[str, str]]]:
    modules: dict[str, str] = {}
    symbols: dict[tuple[str, str], tuple[str, str]] = {}
    for path in paths:
        for number, raw in enumerate(path.read_text().splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            old, sep, new = (part.strip() for part in line.partition("->"))
            if not sep or not old or not new or (":" in old) != (":" in new):
                raise SystemExit(f"{path}:{number}: expected 'old -> new', got {raw!r}")
            if ":" in old:
                old_mod, old_name = old.split(":")
                new_mod, new_name = new.split(":")
                symbols[(old_mod, old_name)] = (new_mod, new_name)
            else:
                modules[old] = new
    return modules, symbols


def remap_module(name: str, modules: dict[str, str]) -> str:
    """``name`` after the moves: the longest moved prefix at a dot boundary is replaced."""
    probe = name
    while probe:
        if probe in modules:
            return modules[probe] + name[len(probe) :]
        probe = probe.rpartition(".")[0]
    return name


def _alias(name: str, asname: str | None) -> str:
    return name if asname in (None, name) else f"{name} as {asname}"


def _from_lines(indent: str, groups: dict[str, list[str]]) -> str:
    lines = []
    for module, names in groups.items():
        one = f"{indent}from {module} import {', '.join(names)}"
        if len(one) <= 110:
            lines.append(one)
        else:
            body = "".join(f"{indent}    {name},\n" for name in names)
            lines.append(f"{indent}from {module} import (\n{body}{indent})")
    return "\n".join(lines)


def rewrite_imports(source: str, modules: dict[str, str], symbols: dict) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [_alias(remap_module(a.name, modules), a.asname) for a in node.names]
            new = f"import {', '.join(names)}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            groups: dict[str, list[str]] = {}
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if (node.module, a.name) in symbols:
                    module, name = symbols[(node.module, a.name)]
                    entry = _alias(name, a.asname or (a.name if name != a.name else None))
                elif remap_module(full, modules) != full and a.name != "*":
                    module, _, name = remap_module(full, modules).rpartition(".")
                    entry = _alias(name, a.asname or (a.name if name != a.name else None))
                else:
                    module, entry = remap_module(node.module, modules), _alias(a.name, a.asname)
                groups.setdefault(module, []).append(entry)
            indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
            new = _from_lines(indent, groups).lstrip()
        else:
            continue
        start = offsets[node.lineno - 1] + node.col_offset
        end = offsets[node.end_lineno - 1] + node.end_col_offset
        if source[start:end] != new and not _same(source[start:end], new):
            edits.append((start, end, new))
    for start, end, new in sorted(edits, reverse=True):
        source = source[:start] + new + source[end:]
    return source


def _same(old: str, new: str) -> bool:
    """The statement only differs in layout (parentheses, line breaks): leave it as written."""
    squash = lambda text: re.sub(r"[\s()]+|,(?=\s*\))", "", text).rstrip(",")  # noqa: E731
    return squash(old) == squash(new)


def _patterns(modules: dict[str, str], symbols: dict) -> list[tuple[re.Pattern[str], str]]:
    out: list[tuple[re.Pattern[str], str]] = []
    for (old_mod, old_name), (new_mod, new_name) in symbols.items():
        for sep in (".", ":"):
            old, new = f"{old_mod}{sep}{old_name}", f"{new_mod}{sep}{new_name}"
            out.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w)"), new))
    for old, new in sorted(modules.items(), key=lambda item: -len(item[0])):
        out.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w)"), new))
        old_path, new_path = old.replace(".", "/"), new.replace(".", "/")
        out.append((re.compile(rf"(?<![\w./]){re.escape(old_path)}(?=\.py\b|/)"), new_path))
    return out


def rewrite_text(text: str, patterns: list[tuple[re.Pattern[str], str]]) -> str:
    for pattern, new in patterns:
        text = pattern.sub(new, text)
    return text


def files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP for part in rel.parts) or not path.is_file():
            continue
        is_map = rel.parts[:1] == ("docs",) and path.name.startswith("moves-")
        if is_map or path == Path(__file__).resolve():
            continue
        if path.suffix in TEXT or path.name in {"Dockerfile", ".importlinter"}:
            found.append(path)
    return sorted(found)


def main(argv: list[str]) -> int:
    maps = [Path(arg) for arg in argv] or sorted((ROOT / "docs").glob("moves-*.txt"))
    modules, symbols = read_map(maps)
    patterns = _patterns(modules, symbols)
    changed: list[str] = []
    for path in files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite_imports(text, modules, symbols) if path.suffix == ".py" else text
        new = rewrite_text(new, patterns)
        if new != text:
            path.write_text(new)
            changed.append(str(path))
    python = [p for p in changed if p.endswith(".py")]
    if python and shutil.which("ruff"):  # split or renamed imports: sort the blocks again
        subprocess.run(["ruff", "check", "--select", "I", "--fix", "-q", *python], check=False)
    print(f"remap_imports: {len(changed)} files rewritten from {', '.join(str(m) for m in maps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
