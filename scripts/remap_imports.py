#!/usr/bin/env python3
"""Rewrite module references after modules moved: imports, strings, config files, paths.

    python scripts/remap_imports.py [MAP ...]      default: every docs/moves-*.txt

A map has one move per line, ``old -> new``; ``#`` starts a comment. Two kinds:

    sharder.plan -> sharder.engine.planning                 a module (or package) moved
    sharder.spec:StrictModel -> sharder.kernel.models:StrictModel   one name moved module

What it rewrites, across the tree (the files git tracks or would track):

* Python imports, through the AST: ``import old``, ``from old import x``, ``from pkg import
  old_leaf`` (a moved module imported from its package; ``as`` is dropped when it named the
  new leaf, added when the leaf was renamed), and ``from m import a, b`` split in two when
  ``a`` and ``b`` now live in different modules;
* any other mention of a dotted name and of its path (``sharder/plan.py``): in Python only
  inside strings and comments (docstrings, ``mock.patch("old.f")``, ``"old:app"``, ``-m
  old``; never in code or an f-string's ``{...}``), and anywhere in ``.md``, ``.toml``,
  ``.importlinter``, ``.sh``, ``.yml``, ``.yaml``, ``.cfg``, ``.ini`` and ``Dockerfile``.

* namespace use of a name that moved alone: ``output.build_bundle`` after ``from sharder
  import output`` becomes ``tree.build_bundle`` with ``from sharder.children import tree``.

Idempotent: a second run changes nothing (a name that already reads as its new form is left
alone, so ``federation.master -> federation.master.render`` can run twice). Afterwards it
runs ``ruff --select I,F401 --fix`` on the files it changed (import order, imports left
unused). Aliases stay as written; attribute access through ``getattr`` or strings built at
run time is not followed (mypy and the tests name those).
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
    # A module moved twice (``changes -> changing``, then ``changing -> base.changing``):
    # every old name goes straight to its last place, and so does every moved name's module.
    for old in modules:
        seen = {old}
        while modules[old] in modules and modules[old] not in seen:
            seen.add(modules[old])
            modules[old] = modules[modules[old]]
    for key, (module, name) in symbols.items():
        symbols[key] = (remap_module(module, modules), name)
    return modules, symbols


def remap_module(name: str, modules: dict[str, str]) -> str:
    """``name`` after the moves: the longest moved prefix at a dot boundary is replaced."""
    probe = name
    while probe:
        if probe in modules:
            new = modules[probe]
            if name == new or name.startswith(new + "."):
                return name  # already moved (``federation.master`` -> ``federation.master.render``)
            return new + name[len(probe) :]
        probe = probe.rpartition(".")[0]
    return name


def _is_new(dotted: str, modules: dict[str, str]) -> bool:
    """``dotted`` (or a prefix of it) already names a module at its new place.

    Needed where an old module became a package of the same name: after ``federation.master
    -> federation.master.render`` and ``federation.pipeline -> federation.master.pipeline``,
    ``federation.master.pipeline`` is new and must not be read as an attribute of the old
    ``federation.master``.
    """
    new = _new_names(modules)
    probe = dotted
    while probe:
        if probe in new and probe not in modules:
            return True
        probe = probe.rpartition(".")[0]
    return False


_NEW: dict[int, frozenset[str]] = {}


def _new_names(modules: dict[str, str]) -> frozenset[str]:
    key = id(modules)
    if key not in _NEW:
        _NEW[key] = frozenset(modules.values())
    return _NEW[key]


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
            names = [
                _alias(a.name if _is_new(a.name, modules) else remap_module(a.name, modules), a.asname)
                for a in node.names
            ]
            new = f"import {', '.join(names)}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            groups: dict[str, list[str]] = {}
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if _is_new(full, modules) or _is_new(node.module, modules):
                    groups.setdefault(node.module, []).append(_alias(a.name, a.asname))
                    continue
                if (node.module, a.name) in symbols:
                    module, name = symbols[(node.module, a.name)]
                    entry = _alias(name, a.asname or (a.name if name != a.name else None))
                elif remap_module(full, modules) != full and a.name != "*":
                    module, _, name = remap_module(full, modules).rpartition(".")
                    entry = _alias(name, a.asname or (a.name if name != a.name else None))
                else:
                    module, entry = remap_module(node.module, modules), _alias(a.name, a.asname)
                groups.setdefault(module, []).append(entry)
            indent = _indent(lines[node.lineno - 1])
            new = _from_lines(indent, groups).lstrip()
        else:
            continue
        start = offsets[node.lineno - 1] + node.col_offset
        end = _end(node, offsets)
        if source[start:end] != new and not _same(source[start:end], new):
            edits.append((start, end, new))
    edits += _namespace_edits(tree, offsets, lines, modules, symbols)
    for start, end, new in sorted(edits, key=lambda edit: (edit[0], edit[1]), reverse=True):
        source = source[:start] + new + source[end:]
    return source


def _namespace_edits(
    tree: ast.AST, offsets: list[int], lines: list[str], modules: dict[str, str], symbols: dict
) -> list[tuple[int, int, str]]:
    """``output.build_bundle`` -> ``tree.build_bundle`` (+ ``from sharder.children import tree``)
    where a module is used as a namespace and the name alone moved to another module."""
    moved_from = {old for old, _ in symbols}
    bound: dict[str, tuple[str, ast.stmt]] = {}  # local name -> (old module, its import)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                if f"{node.module}.{a.name}" in moved_from and not _is_new(node.module, modules):
                    bound[a.asname or a.name] = (f"{node.module}.{a.name}", node)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in moved_from:
                    bound[a.asname] = (a.name, node)
    if not bound:
        return []
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    edits: list[tuple[int, int, str]] = []
    added: dict[tuple[str, str], ast.stmt] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            continue
        if node.value.id not in bound or (bound[node.value.id][0], node.attr) not in symbols:
            continue
        old_module, statement = bound[node.value.id]
        new_module, new_name = symbols[(old_module, node.attr)]
        parent, _, leaf = new_module.rpartition(".")
        local = leaf if leaf not in taken or leaf in bound else f"{leaf}_module"
        start = offsets[node.lineno - 1] + node.col_offset
        end = _end(node, offsets)
        edits.append((start, end, f"{local}.{new_name}"))
        added.setdefault((parent, _alias(leaf, local)), statement)
    for (parent, entry), statement in added.items():
        indent = _indent(lines[statement.lineno - 1])
        at = _end(statement, offsets)
        edits.append((at, at, f"\n{indent}from {parent} import {entry}"))
    return edits


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _end(node: ast.stmt | ast.expr, offsets: list[int]) -> int:
    assert node.end_lineno is not None and node.end_col_offset is not None  # parsed, not built
    return offsets[node.end_lineno - 1] + node.end_col_offset


def _same(old: str, new: str) -> bool:
    """The statement only differs in layout (parentheses, line breaks): leave it as written."""
    squash = lambda text: re.sub(r"[\s()]+|,(?=\s*\))", "", text).rstrip(",")  # noqa: E731
    return squash(old) == squash(new)


Patterns = list[tuple[re.Pattern[str], str]]
MODULES: dict[str, str] = {}
"""The module moves of this run, for :func:`_replace` (set by :func:`main`)."""


def _patterns(modules: dict[str, str], symbols: dict) -> Patterns:
    out: Patterns = []
    for (old_mod, old_name), (new_mod, new_name) in symbols.items():
        for sep in (".", ":"):
            old, new = f"{old_mod}{sep}{old_name}", f"{new_mod}{sep}{new_name}"
            out.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w)"), new))
    for old, new in sorted(modules.items(), key=lambda item: -len(item[0])):
        out.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w)"), new))
        old_path, new_path = old.replace(".", "/"), new.replace(".", "/")
        out.append((re.compile(rf"(?<![\w./]){re.escape(old_path)}(?=\.py\b|/)"), new_path))
    return out


def rewrite_text(text: str, patterns: Patterns, *, fstring: bool = False) -> str:
    # One pass over all patterns at once, so a replacement is never matched again.
    combined = re.compile("|".join(f"(?P<p{i}>{p.pattern})" for i, (p, _) in enumerate(patterns)))
    news = [new for _, new in patterns]

    def one(match: re.Match[str]) -> str:
        index = int(next(name for name, value in match.groupdict().items() if value is not None)[1:])
        return _replace(match, news[index], fstring=fstring)

    return combined.sub(one, text) if patterns else text


def _replace(match: re.Match[str], new: str, *, fstring: bool) -> str:
    """``new`` for a match, unless it already reads as a new name or is f-string code."""
    text, start = match.string, match.start()
    chain = re.match(r"[\w./]+", text[start:])
    dotted = chain.group(0).removesuffix(".py").replace("/", ".") if chain else ""
    if _is_new(dotted.rstrip("."), MODULES):
        return match.group(0)  # already moved: the old name is a prefix of a new one
    if fstring:
        before = text[:start].replace("{{", "").replace("}}", "")
        if before.count("{") > before.count("}"):
            return match.group(0)  # code, not text: ``f"{federation.master.url}"`` is a variable
    return new


def rewrite_python_text(source: str, patterns: Patterns) -> str:
    """Rewrite names in strings and comments only: code is the AST pass's business."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return source
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    edits = []
    for token in tokens:
        kind = tokenize.tok_name[token.type]
        if kind not in {"STRING", "COMMENT", "FSTRING_MIDDLE"}:
            continue
        text = token.string
        prefix = text[: len(text) - len(text.lstrip("rRbBfFuU"))].lower() if kind == "STRING" else ""
        new = rewrite_text(text, patterns, fstring="f" in prefix)
        if new != token.string:
            start = offsets[token.start[0] - 1] + token.start[1]
            end = offsets[token.end[0] - 1] + token.end[1]
            edits.append((start, end, new))
    for start, end, new in sorted(edits, reverse=True):
        source = source[:start] + new + source[end:]
    return source


def files() -> list[Path]:
    """Tracked and untracked files git does not ignore (so never ``.venv`` or caches)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split("\0")
    found = []
    for name in sorted(set(filter(None, listed))):
        path = ROOT / name
        is_map = name.startswith("docs/moves-")
        if is_map or path == Path(__file__).resolve() or not path.is_file():
            continue
        if path.suffix in TEXT or path.name in {"Dockerfile", ".importlinter"}:
            found.append(path)
    return found


def main(argv: list[str]) -> int:
    maps = [Path(arg) for arg in argv] or sorted((ROOT / "docs").glob("moves-*.txt"))
    modules, symbols = read_map(maps)
    MODULES.update(modules)
    patterns = _patterns(modules, symbols)
    changed: list[str] = []
    for path in files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if path.suffix == ".py":
            new = rewrite_python_text(rewrite_imports(text, modules, symbols), patterns)
        else:
            new = rewrite_text(text, patterns)
        if new != text:
            path.write_text(new)
            changed.append(str(path))
    python = [p for p in changed if p.endswith(".py")]
    if python and shutil.which("ruff"):  # split or renamed imports: sort the blocks again, and
        # drop a namespace import whose every use moved to another module
        subprocess.run(["ruff", "check", "--select", "I,F401", "--fix", "-q", *python], check=False)
    print(f"remap_imports: {len(changed)} files rewritten from {', '.join(str(m) for m in maps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
