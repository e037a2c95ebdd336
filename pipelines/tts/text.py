"""Sentence splitting for streaming speech: one sentence is one unit of synthesis.

A sentence ends at `.`, `!`, `?` or `…` (closing quotes and brackets included) followed by
a space, or at a blank line, except where the period belongs to a word:

- known abbreviations (`Dr.`, `vs.`; `No.` and `Jan.` before a number), initials
  (`J. R. R.`) and dotted acronyms (`U.S.`, `e.g.`, `p.m.`);
- a number that opens its sentence (a list item, `1. First`);
- any period followed by a word in lower case (`... and then`).

Periods inside numbers (`3.14`, `1,000.50`) are never followed by a space, so they
never end a sentence. A sentence over `max_chars` is cut at its last clause mark (`,`
`;` `:` or a dash, followed by a space) past half the limit, else at its last space,
else hard at the limit; a cut never falls inside a number like `1,000`.
"""

from __future__ import annotations

import re

_TITLE_WORDS = """
mr mrs ms mx dr prof sr jr st mt ft gen col capt lt sgt cmdr adm gov sen rep rev hon pres
supt messrs vs cf approx ave blvd rd hwy apt dept est
"""
_NUMBERED_WORDS = """
no nos vol vols pp p fig figs ch sec art al jan feb mar apr jun jul aug sep sept oct nov dec
"""
TITLES = frozenset(_TITLE_WORDS.split())
"""Lower-case abbreviations whose period never ends a sentence."""
BEFORE_NUMBERS = frozenset(_NUMBERED_WORDS.split())
"""Lower-case abbreviations whose period does not end a sentence before a number
(`No. 5`, `Jan. 3`, `et al. (2020)`), where they could also be plain words (`no.`)."""

# Quotes and dashes by code point: \u2026 ellipsis, \u2018/\u2019 and \u201c/\u201d curly
# quotes, \u00ab/\u00bb guillemets, \u2013/\u2014 dashes.
_END = re.compile(r"(?:[.!?]+|\u2026)[\"'\u201d\u2019\u00bb)\]]*(?=\s)")
_WORD_BEFORE = re.compile(r"([\w.'\u2019-]+)$")
_NEXT_WORD = re.compile(r"\s*[\"'\u201c\u2018\u00ab(\[]*(\S)")
_CLAUSE = re.compile(r"(?:[,;:]|\s[-\u2013\u2014])(?=\s)")
_PARAGRAPH = re.compile(r"\n\s*\n")


def split_sentences(text: str, max_chars: int = 400) -> list[str]:
    """The sentences of `text` in order, each at most `max_chars` long, none empty."""
    sentences: list[str] = []
    for paragraph in _PARAGRAPH.split(text):
        flat = " ".join(paragraph.split())
        for sentence in _sentences(flat):
            sentences.extend(cut_long(sentence, max_chars))
    return [s for s in sentences if any(ch.isalnum() for ch in s)]


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    start = 0
    for match in _END.finditer(text):
        if _is_boundary(text, start, match):
            out.append(text[start : match.end()].strip())
            start = match.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


def _is_boundary(text: str, start: int, match: re.Match[str]) -> bool:
    following = _NEXT_WORD.match(text, match.end())
    if following is None:
        return True
    if following.group(1).islower():
        return False
    if not match.group().startswith(".") or match.group().startswith(".."):
        return True
    before = _WORD_BEFORE.search(text, start, match.start())
    word = before.group(1) if before else ""
    first = before is not None and not text[start : before.start()].strip()
    return not _word_keeps_period(word, first, following.group(1).isdigit())


def _word_keeps_period(word: str, first: bool, number_next: bool) -> bool:
    """True when the period after `word` belongs to it rather than ending the sentence."""
    bare = word.rstrip(".").lower()
    if bare in TITLES or (number_next and bare in BEFORE_NUMBERS):
        return True
    if len(bare) == 1 and bare.isalpha():
        return True  # an initial: "J. R. R. Tolkien"
    if "." in word.strip("."):
        return True  # a dotted acronym: "U.S.", "e.g", "p.m"
    return first and bare.isdigit()  # a list item: "1. Preheat the oven."


def cut_long(sentence: str, max_chars: int) -> list[str]:
    """`sentence` in pieces of at most `max_chars`, cut where speech can pause."""
    pieces: list[str] = []
    rest = sentence.strip()
    while len(rest) > max_chars:
        at = _cut_point(rest, max_chars)
        pieces.append(rest[:at].strip())
        rest = rest[at:].strip()
    if rest:
        pieces.append(rest)
    return pieces


def _cut_point(text: str, max_chars: int) -> int:
    window = text[: max_chars + 1]
    clauses = [m.end() for m in _CLAUSE.finditer(window) if max_chars // 2 <= m.end() <= max_chars]
    if clauses:
        return clauses[-1]
    space = window.rfind(" ")
    if space > 0:
        return space
    return max_chars
