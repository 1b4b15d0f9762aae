"""Text as the memory store searches it, whatever the backend: the searchable form of saved
text, the tokens in it, and the phrases a query asks for.

Tokens are those of SQLite FTS5's `unicode61` tokenizer with `remove_diacritics 2`, which the
SQLite store indexes with and the PostgreSQL store reproduces (`tokens`, learned from SQLite
character by character): runs of letters, digits and private-use characters as Unicode 6.1
knew them, case-folded, with the accents of Latin letters removed.
That tokenizer makes a whole run of Chinese, Japanese or Korean characters one token, so such
runs are spelled as overlapping bigrams followed by the run's last character (`searchable`),
and queried the same way: two or more characters become a phrase of bigrams, a single
character a prefix of any indexed token.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
import threading
import unicodedata
from collections.abc import Sequence
from typing import NamedTuple

# The SQLite store's FTS5 tokenizer, which `tokens` reproduces.
FTS5_TOKENIZER = "unicode61 remove_diacritics 2"

# Letters of scripts written without spaces between words (Han, kana) and Hangul, whose
# words unicode61 cannot find inside a run. Punctuation of those blocks is left out.
_CJK_RUN = re.compile(
    "["
    "\u1100-\u11ff"  # Hangul Jamo
    "\u3005-\u3007"  # 々 〆 〇
    "\u3041-\u3096\u309d-\u309f"  # Hiragana
    "\u30a1-\u30fa\u30fc-\u30ff"  # Katakana (not the middle dot ・)
    "\u3131-\u318e"  # Hangul compatibility Jamo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf\u4e00-\u9fff"  # CJK ideographs, extension A
    "\uac00-\ud7a3"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK ideographs, extensions B-H
    "]+"
)
# A "quoted phrase", or a run of anything but blanks and quotes (a stray quote is dropped).
_TERM = re.compile(r'"([^"]*)"|([^\s"]+)')
# Typed between words out of search-engine habit; every word must match anyway.
_CONNECTIVES = frozenset({"AND", "OR", "NEAR"})


class Phrase(NamedTuple):
    """Words that must occur in this order, the last one as a prefix when `prefix`. `text` is
    searchable text, to be split into tokens as the index split the saved text."""

    text: str
    prefix: bool = False


def searchable(text: str) -> str:
    """Text as the index holds it: NFKC-normalised, CJK runs spelled as bigrams."""
    if text.isascii():  # NFKC leaves ASCII as it is, and it holds no CJK run
        return text
    return _CJK_RUN.sub(_indexed_run, unicodedata.normalize("NFKC", text))


def _indexed_run(run: re.Match[str]) -> str:
    chars = run[0]
    return " " + " ".join([*_bigrams(chars), chars[-1]]) + " "


def _bigrams(chars: str) -> list[str]:
    return [chars[i : i + 2] for i in range(len(chars) - 1)]


def query_phrases(query: str) -> list[Phrase]:
    """The phrases of `query` that must all match: every word and "quoted phrase"; a word
    ending in `*` is a prefix. Operators, column names, `:` and punctuation are plain text
    (split as the saved text was); an empty list when the query holds no word at all. AND, OR
    and NEAR between words are left out, but a query of nothing else looks for them."""
    cleaned = _clean(query)
    return _query_phrases(cleaned, _CONNECTIVES) or _query_phrases(cleaned, frozenset())


def _query_phrases(query: str, connectives: frozenset[str]) -> list[Phrase]:
    phrases: list[Phrase] = []
    for term in _TERM.finditer(query):
        if term[1] is not None:
            phrases += _phrases(term[1])
            continue
        for word in term[2].split(":"):  # `title:foo` is two words, not a column filter
            if word not in connectives:
                phrases += _phrases(word.rstrip("*"), prefix=word.endswith("*"))
    # Each once: all must match, and a word pasted a thousand times would be matched as often.
    return list(dict.fromkeys(phrases))


def _clean(query: str) -> str:
    # Control and format characters would end an FTS5 string early (NUL) or match nothing.
    text = unicodedata.normalize("NFKC", query)
    return "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Cn") else c for c in text)


def _phrases(term: str, prefix: bool = False) -> list[Phrase]:
    """One word or phrase as phrases that must all match. A CJK run becomes its bigrams
    (plus its last character when more words follow, as in the index); a lone CJK character
    ends a phrase as a prefix, since the index holds it only at the start of a token."""
    phrases: list[Phrase | None] = []
    parts: list[str] = []
    position = 0
    for run in _CJK_RUN.finditer(term):
        parts.append(term[position : run.start()])
        position = run.end()
        chars = run[0]
        if len(chars) == 1:
            phrases.append(_phrase([*parts, chars], prefix=True))
            parts = []
        else:
            parts += _bigrams(chars)
            if _has_word(term[position:]):
                parts.append(chars[-1])
    parts.append(term[position:])
    phrases.append(_phrase(parts, prefix))
    return [phrase for phrase in phrases if phrase]


def _phrase(parts: list[str], prefix: bool) -> Phrase | None:
    text = " ".join(part for part in parts if part)
    if not _has_word(text):
        return None  # only punctuation: nothing to look for
    return Phrase(text, prefix)


def _has_word(text: str) -> bool:
    """Whether unicode61 finds a token in `text`."""
    return bool(tokens(text))


# --- tokens, as unicode61 finds them ---------------------------------------------------------

_ASCII_TOKEN = re.compile("[A-Za-z0-9]+")
# Each character as unicode61 leaves it in a token (case-folded; "" for an accent it drops), or
# " " where it ends one. unicode61 keeps the tables of Unicode 6.1 and Python its own, newer:
# letters and emoji assigned since are parts of words to unicode61, and some letters fold
# otherwise. So a character beyond ASCII is learned from the running SQLite the first time it
# is seen, and both backends split text exactly as the SQLite index does.
_UNICODE61: dict[int, str] = {code: chr(code).lower() if chr(code).isalnum() else " " for code in range(128)}
_learned = set(map(chr, _UNICODE61))  # its keys as characters: a set difference finds new ones in C
_learning = threading.Lock()


def tokens(text: str) -> list[str]:
    """The tokens of searchable text (`searchable`), in order, as unicode61 finds them."""
    if text.isascii():
        return _ASCII_TOKEN.findall(text.lower())
    if unknown := set(text).difference(_learned):
        _learn(unknown)
    return text.translate(_UNICODE61).split()  # a run of dropped accents alone is no token


def _learn(chars: set[str]) -> None:
    """Ask SQLite's unicode61 what it makes of each of `chars`, between letters."""
    ordered = sorted(chars)
    with _learning, contextlib.closing(sqlite3.connect(":memory:")) as conn:
        conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(a, tokenize='{FTS5_TOKENIZER}')")
        conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        samples = [(row, f"ab{char}cd") for row, char in enumerate(ordered, start=1) if _encodable(char)]
        conn.executemany("INSERT INTO t (rowid, a) VALUES (?, ?)", samples)
        found: dict[int, list[str]] = {}
        for term, row in conn.execute("SELECT term, doc FROM v ORDER BY doc, offset"):
            found.setdefault(row, []).append(term)
        for row, char in enumerate(ordered, start=1):
            match found.get(row):
                case [one] if one.startswith("ab") and one.endswith("cd"):
                    _UNICODE61[ord(char)] = one[2:-2]  # within a word: as folded
                case _:
                    _UNICODE61[ord(char)] = " "  # between two words (or not text at all)
            _learned.add(char)


def _encodable(char: str) -> bool:
    return not 0xD800 <= ord(char) <= 0xDFFF  # a lone surrogate is no text to SQLite


# --- a phrase in a text, as the index finds it ----------------------------------------------

# FTS5 cuts every token, saved or asked for, at this many bytes (its FTS5_MAX_TOKEN_SIZE).
_FTS5_TOKEN_CUT = 32_768
HOLDS_UP_TO = _FTS5_TOKEN_CUT // 4  # characters of up to 4 bytes: no token in them reaches the cut


class PhraseMatcher:
    """A query's phrases, to tell which of them the index finds in saved texts (before
    `searchable`): a phrase's tokens one after another, the last one as a prefix when
    `phrase.prefix`. Each text is split once, however many phrases there are. FTS5 cuts a
    token at 32 KiB, which this does not: `exact_for` says when that cannot matter."""

    def __init__(self, phrases: Sequence[Phrase]) -> None:
        self._wanted = [(tuple(tokens(phrase.text)), phrase.prefix) for phrase in phrases]
        self._firsts = [(i, wanted[0]) for i, (wanted, _) in enumerate(self._wanted)]
        # A phrase as `_Split.spaced` holds it: a blank before each token, and after the last
        # unless that one is a prefix of the text's token.
        self._spaced = [" " + " ".join(wanted) + ("" if prefix else " ") for wanted, prefix in self._wanted]
        # A token FTS5 cut neither equals nor starts with one shorter than the cut: with every
        # token of the phrases that short, the cut changes nothing, in texts of any length.
        self._under_the_cut = all(
            len(token.encode()) < _FTS5_TOKEN_CUT for wanted, _ in self._wanted for token in wanted
        )

    def exact_for(self, text: str) -> bool:
        """Whether `held_in(text)` is what the index finds in `text`."""
        return self._under_the_cut or len(text) < HOLDS_UP_TO

    def held_in(self, text: str) -> list[int]:
        """The phrases `text` holds, by their place in the query."""
        if text.isascii():
            lowered = text.lower()
            # A token of ASCII text is a piece of its lowered form: most texts fail here, unsplit.
            maybe = [i for i, first in self._firsts if first in lowered]
            if not maybe:
                return []
            found = _Split(_ASCII_TOKEN.findall(lowered))
        else:
            maybe, found = list(range(len(self._wanted))), _Split(tokens(searchable(text)))
        return [i for i in maybe if self._holds(i, found)]

    def _holds(self, phrase: int, found: _Split) -> bool:
        wanted, prefix = self._wanted[phrase]
        if len(wanted) == 1 and not prefix:
            return wanted[0] in found.present
        return all(token in found.present for token in wanted[:-1]) and self._spaced[phrase] in found.spaced


class _Split:
    """A text's tokens, in order and as a set."""

    def __init__(self, found: list[str]) -> None:
        self.found = found
        self.present = set(found)

    @functools.cached_property
    def spaced(self) -> str:
        """The tokens, a blank before and after each. No token holds a blank, so a phrase's
        tokens spaced alike occur in this only where they follow one another: one search in C,
        in time linear in the text, where comparing the phrase at each token took as long as
        their product (a pasted phrase of 4,000 tokens in a long text: seconds)."""
        return f" {' '.join(self.found)} "
