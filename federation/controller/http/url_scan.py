"""Where URLs are in free text, found in one pass (what ``redact`` masks credentials in).

A regular expression ``[a-z][a-z0-9+.-]*://\\S+`` run by ``re.sub`` retries its scheme at
every position of a long run of scheme characters that never reaches ``://``: a 7,900
character node name cost seconds of CPU per GET. This scanner finds each ``://`` with
``str.find`` and walks back over the scheme and forward over the rest, never over a
character twice, so the work is linear in the text. It finds what that expression finds
(the leftmost scheme letter of the run before ``://``, then everything up to a space, a
quote or an angle bracket); ``steps`` counts the characters it looked at, which the tests
bound per character of input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

SCHEME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
STOP = frozenset("\"'<>")


class UrlScanner:
    """``spans(text)`` yields (start, end) of each URL; ``steps`` adds up the work done."""

    def __init__(self) -> None:
        self.steps = 0

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        floor = 0  # nothing before here is looked at again
        search = 0
        size = len(text)
        while True:
            mark = text.find("://", search)
            self.steps += (size if mark < 0 else mark + 3) - search
            if mark < 0:
                return
            start = mark
            while start > floor and text[start - 1] in SCHEME:
                start -= 1
            self.steps += mark - start
            while start < mark and text[start] not in LETTERS:
                start += 1
            if start == mark:  # no scheme letter: walk no further than the '://'
                floor = search = mark + 1
                continue
            end = mark + 3
            while end < size and not text[end].isspace() and text[end] not in STOP:
                end += 1
            self.steps += end - mark - 3
            if end == mark + 3:  # nothing after '://'
                floor = search = mark + 1
                continue
            yield start, end
            floor = search = end


def substitute(text: str, replace: Callable[[str], str], scanner: UrlScanner | None = None) -> str:
    """``text`` with each URL replaced by ``replace(url)``."""
    scanner = scanner or UrlScanner()
    out: list[str] = []
    at = 0
    for start, end in scanner.spans(text):
        out.append(text[at:start])
        out.append(replace(text[start:end]))
        at = end
    if not out:
        return text
    out.append(text[at:])
    return "".join(out)
