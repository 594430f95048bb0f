"""Node identity into the rendered Promtail file, for Grafana Alloy.

``logs/promtail.yml`` is one file for the whole fleet: each node's identity comes from its
environment as ``${NODE_NAME}``, ``${GPUFED_LOKI_URL:-default}`` (Promtail expands them with
``-config.expand-env=true``). Alloy runs a Promtail file as it is
(``alloy run --config.format=promtail``) but does not expand variables, so on a GPU node
``compose/node.yml`` runs this first (service ``alloy-config``, the gpufed image) and Alloy
reads the result.

The two forms Promtail's expansion gives the rendered file are handled as it does (an unset
or empty variable is empty; ``:-`` gives the default when unset or empty); ``$$`` is a
literal ``$``. Any other ``$`` form is refused by name, since the file never needs one.

    python -m logs.expand_env SRC DST
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

_REF = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|(.?))")


class ExpandError(ValueError):
    pass


def expand(text: str, env: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name, default, other = match[1], match[2], match[3]
        if match[0] == "$$":
            return "$"
        if name is None:
            line = text.count("\n", 0, match.start()) + 1
            raise ExpandError(f"line {line}: unsupported '${other}' (only ${{VAR}} and ${{VAR:-default}})")
        value = env.get(name, "")
        return value if value or default is None else default

    return _REF.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m logs.expand_env SRC DST", file=sys.stderr)
        return 2
    src, dst = Path(args[0]), Path(args[1])
    try:
        text = expand(src.read_text(), os.environ)
    except (OSError, UnicodeDecodeError, ExpandError) as exc:
        print(f"error: {src}: {exc}", file=sys.stderr)
        return 1
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = dst.with_name(f".{dst.name}.new")
    staging.write_text(text)
    os.replace(staging, dst)  # Alloy never reads a half-written file
    print(f"expanded {src} -> {dst}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
