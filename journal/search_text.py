"""Text as the memory store searches it, whatever the backend: the searchable form of saved
text, the tokens in it, and the phrases a query asks for.

Tokens are those of SQLite FTS5's `unicode61` tokenizer with `remove_diacritics 2`, which the
SQLite store indexes with and the PostgreSQL store reproduces (`tokens`): runs of letters,
digits and private-use characters, case-folded, with the accents of Latin letters removed.
That tokenizer makes a whole run of Chinese, Japanese or Korean characters one token, so such
runs are spelled as overlapping bigrams followed by the run's last character (`searchable`),
and queried the same way: two or more characters become a phrase of bigrams, a single
character a prefix of any indexed token.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import unicodedata
from functools import cache, lru_cache
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
    (split as the saved text was); an empty list when the query holds no word at all."""
    phrases: list[Phrase] = []
    for term in _TERM.finditer(_clean(query)):
        if term[1] is not None:
            phrases += _phrases(term[1])
            continue
        for word in term[2].split(":"):  # `title:foo` is two words, not a column filter
            if word not in _CONNECTIVES:
                phrases += _phrases(word.rstrip("*"), prefix=word.endswith("*"))
    return phrases


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
    """Whether unicode61 finds a token in `text`: it keeps letters, digits and private-use marks."""
    return any(is_token_char(c) for c in text)


def is_token_char(char: str) -> bool:
    category = unicodedata.category(char)
    return category[0] in "LN" or category == "Co"


# --- tokens, as unicode61 finds them ---------------------------------------------------------

# The combining marks unicode61 removes (remove_diacritics 2): those that accent Latin
# letters, as in the decompositions of "é" or "ǖ". They belong to the token they accent.
_DIACRITICS = "".join(
    sorted(
        {
            mark
            for char in map(chr, range(0x80, 0x3000))
            if len(parts := unicodedata.normalize("NFD", char)) > 1 and parts[0].isascii() and parts[0].isalpha()
            for mark in parts[1:]
        }
    )
)
# `[^\W_]` is exactly Unicode's letters and digits (categories L and N); then private use (Co).
_TOKEN = re.compile(f"(?:[^\\W_]|[\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd{_DIACRITICS}])+")
_ASCII_TOKEN = re.compile("[A-Za-z0-9]+")


def tokens(text: str) -> list[str]:
    """The tokens of searchable text (`searchable`), in order, as unicode61 finds them."""
    if text.isascii():
        return _ASCII_TOKEN.findall(text.lower())
    found = (_fold(run) for run in _TOKEN.findall(text))
    return [token for token in found if token]  # a run of accents alone holds no letter


def _fold(run: str) -> str:
    return run.lower() if run.isascii() else "".join(map(_fold_char, run))


@cache
def _fold_char(char: str) -> str:
    """A character case-folded (one for one, as unicode61 does: ς is σ, but ß stays ß), and
    without its accents when it is a Latin letter; an accent on its own is dropped."""
    folded = char.casefold()
    if len(folded) != 1:
        folded = char.lower()
    parts = unicodedata.normalize("NFD", folded)
    if parts[0] in _DIACRITICS:
        return ""
    if len(parts) > 1 and parts[0].isascii() and all(unicodedata.combining(mark) for mark in parts[1:]):
        return parts[0]
    return folded


# --- a phrase in a text, as the index finds it ----------------------------------------------


def holds(text: str, phrase: Phrase) -> bool:
    """Whether the index finds `phrase` in saved `text` (before `searchable`): its tokens one
    after another, the last one as a prefix when `phrase.prefix`. Exact where
    `split_as_by_sqlite` says so of the text and the phrase."""
    wanted = _phrase_tokens(phrase)
    if text.isascii():
        lowered = text.lower()
        # A token of ASCII text is a piece of its lowered form: most texts fail here, unsplit.
        if not all(token in lowered for token in wanted):
            return False
        return _in_order(_ASCII_TOKEN.findall(lowered), wanted, phrase.prefix)
    return _in_order(tokens(searchable(text)), wanted, phrase.prefix)


@lru_cache(maxsize=256)
def _phrase_tokens(phrase: Phrase) -> tuple[str, ...]:
    return tuple(tokens(phrase.text))


def _in_order(found: list[str], wanted: tuple[str, ...], prefix: bool) -> bool:
    *head, last = wanted
    for start in range(len(found) - len(head)):
        end = start + len(head)
        if found[start:end] == head and (found[end].startswith(last) if prefix else found[end] == last):
            return True
    return False


# --- where `tokens` is SQLite's tokenizer ------------------------------------------------------

# FTS5 cuts a token at this many bytes: a text this long may hold one.
_LONGEST_TOKEN_BYTES = 32_768
_split_alike: dict[str, bool] = {}  # a character: whether unicode61 and `tokens` treat it alike
_checking = threading.Lock()


def split_as_by_sqlite(text: str) -> bool:
    """Whether SQLite's unicode61 splits and folds saved `text` exactly as `tokens` does.
    unicode61 keeps Unicode 6.1's tables and Python its own: they differ on a few hundred
    letters each folds its own way, and on characters assigned since (to unicode61 parts of
    words), many emoji among them. Always so of ASCII; each other character is checked once,
    against the running SQLite."""
    if len(text) * 4 >= _LONGEST_TOKEN_BYTES:
        return False
    if text.isascii():
        return True
    chars = set(searchable(text))
    if unknown := [char for char in chars if char not in _split_alike]:
        _check_with_sqlite(unknown)
    return all(map(_split_alike.__getitem__, chars))


def _check_with_sqlite(chars: list[str]) -> None:
    """Tokenize each of `chars` between letters with unicode61 and with `tokens`, and note
    whether they agree."""
    samples = [searchable(f"ab{char}cd") for char in chars]
    with _checking, contextlib.closing(sqlite3.connect(":memory:")) as conn:
        conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(a, tokenize='{FTS5_TOKENIZER}')")
        conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        conn.executemany("INSERT INTO t (rowid, a) VALUES (?, ?)", enumerate(samples, start=1))
        found: dict[int, list[str]] = {}
        for term, row in conn.execute("SELECT term, doc FROM v ORDER BY doc, offset"):
            found.setdefault(row, []).append(term)
    for row, (char, sample) in enumerate(zip(chars, samples, strict=True), start=1):
        _split_alike[char] = found.get(row, []) == tokens(sample)
