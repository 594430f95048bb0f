"""Regexes as Prometheus (Go's RE2 syntax) reads them, checked before a config is written.

Specs are validated in Python, but the regexes end up in ``metric_relabel_configs`` that
Go compiles. Python's ``re`` accepts constructs RE2 refuses: look-around, back-references,
conditionals, atomic groups and possessive repeats, ``\\Z``, the ``x``/``a``/``L`` flags
and repeat counts above 1000. :func:`check_re2` parses with Python's own parser and walks
the parse tree for those, so ``gpufed render --no-check`` cannot write a relabel rule that
Prometheus refuses to load. A few RE2-only spellings (``\\z``, ``[[:alpha:]]``) are refused
too, since Python cannot parse them: the error says to use the equivalent that both read.
"""

from __future__ import annotations

import importlib
import re
import warnings
from typing import Any

# Python's own regex parser (public as sre_parse before 3.11, which warns on import).
sre_constants: Any = importlib.import_module("re._constants")
sre_parse: Any = importlib.import_module("re._parser")

RE2_MAX_REPEAT = 1000
_REFUSED = {
    sre_constants.ASSERT: "look-ahead/look-behind",
    sre_constants.ASSERT_NOT: "negative look-ahead/look-behind",
    sre_constants.GROUPREF: "back-references",
    sre_constants.GROUPREF_EXISTS: "conditional groups",
}
for _name, _why in (("ATOMIC_GROUP", "atomic groups"), ("POSSESSIVE_REPEAT", "possessive repeats")):
    if hasattr(sre_constants, _name):
        _REFUSED[getattr(sre_constants, _name)] = _why
_REPEATS = {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT}
_ALLOWED_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL | re.UNICODE


def check_re2(pattern: str) -> str:
    """``pattern`` unchanged if both Python and Go's RE2 accept it; ValueError saying why not."""
    if "\\Z" in pattern.replace("\\\\", ""):
        raise ValueError(r"RE2 has no \Z; use $ (Prometheus anchors every regex anyway)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FutureWarning on '[[' must not escape as an error
            parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regex: {exc}") from None
    except RecursionError:
        raise ValueError("regex nested too deeply") from None
    if parsed.state.flags & ~_ALLOWED_FLAGS:
        raise ValueError("RE2 supports only the i, m and s flags")
    _walk(parsed)
    return pattern


def _walk(parsed: Any) -> None:
    stack = [parsed]
    while stack:
        for op, arg in stack.pop():
            if op in _REFUSED:
                raise ValueError(f"Prometheus' regex engine (RE2) does not support {_REFUSED[op]}")
            if op in _REPEATS:
                low, high, sub = arg
                if low > RE2_MAX_REPEAT or (high != sre_constants.MAXREPEAT and high > RE2_MAX_REPEAT):
                    raise ValueError(f"RE2 allows repeat counts up to {RE2_MAX_REPEAT}")
                stack.append(sub)
            elif op is sre_constants.SUBPATTERN:
                _group, add_flags, del_flags, sub = arg
                if (add_flags | del_flags) & ~_ALLOWED_FLAGS:
                    raise ValueError("RE2 supports only the i, m and s flags")
                stack.append(sub)
            elif op is sre_constants.BRANCH:
                stack.extend(arg[1])
            elif op is sre_constants.AT and arg is sre_constants.AT_END_STRING:
                raise ValueError(r"RE2 has no \Z; use $ (Prometheus anchors every regex anyway)")
