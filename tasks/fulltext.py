"""The ``search`` tool: full-text search over the texts shipped in ``tasks/corpus/``.

The corpus format is plain text: the first non-empty line of a file is the work's
title, a line starting with ``## `` opens a section (a fable, a part of a story), and
paragraphs are separated by blank lines. Every ``*.txt`` and ``*.md`` file in the
folder is indexed; ``SOURCES`` says where the texts come from.

The index is an in-memory SQLite FTS5 table, built on a process's first search and
kept for the life of the process. One lock guards the connection, because a worker
may run tools on several threads.
"""

from __future__ import annotations

import atexit
import importlib.resources
import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, TypedDict

from pydantic import Field

from executor import tool

__all__ = ["SearchHit", "search"]

#: Longest query accepted, in characters, and most distinct words used from it.
MAX_QUERY_CHARS = 500
MAX_TERMS = 32

_WORD = re.compile(r"[^\W_]+")  # runs of letters and digits, as FTS5 splits words
_SNIPPET_TOKENS = 24
# bm25 weights, one per column: source, title, section, paragraph, body. Titles and
# sections are indexed so "gettysburg" or "belling the cat" find their passages, but
# weigh less than the text: FTS5 normalises by the whole row's length, so a heavy
# section would rank a fable's one-line moral above the paragraph that tells it.
_BM25 = "bm25(passages, 0.0, 0.1, 0.2, 0.0, 1.0)"
# Words too common to make a passage relevant on their own: left out of the "any word"
# top-up (but kept when they are all the query has, e.g. "to be or not to be").
_COMMON_WORDS = (
    "a an and are as at be but by for from had has have he her his i in is it its me my "
    "not of on or our she so that the their them then there they this to was we were "
    "what when which who will with you your"
)
_STOPWORDS = frozenset(_COMMON_WORDS.split())


class SearchHit(TypedDict):
    """One matching paragraph, as the model sees it."""

    source: str
    title: str
    section: str | None
    paragraph: int
    snippet: str
    score: float


@tool
def search(
    query: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS)],
    limit: Annotated[int, Field(ge=1, le=20)] = 5,
) -> list[SearchHit]:
    """Search a small library of public-domain texts and return the best-matching passages.

    The library holds Aesop's Fables (82 fables in Joseph Jacobs's 1894 retelling),
    two Sherlock Holmes stories by Arthur Conan Doyle (A Scandal in Bohemia and The
    Red-Headed League), Edgar Allan Poe's The Cask of Amontillado, and Abraham
    Lincoln's Gettysburg Address. Use it to find, check or quote what these texts say.

    Words match regardless of case and word endings ("fox" also finds "foxes");
    punctuation and search operators such as AND, OR or quotes are treated as plain
    words. Passages containing every word of the query come first; if there are
    fewer than `limit` of them, passages containing only some of the words follow
    (common words such as "the" or "and" are not enough on their own).

    Each result has: `source` (the file), `title` (the work), `section` (the fable's
    title or the story's part, or null), `paragraph` (its number within the file,
    from 1), `snippet` (an excerpt with the matching words in [brackets]) and `score`
    (relevance; higher is better). An empty list means no passage contains any of the
    words: try other or fewer words.

    Args:
        query: The words to look for, e.g. "fox grapes" or "red-headed league
            pawnbroker". Must contain at least one letter or digit.
        limit: The most passages to return, from 1 to 20.
    """
    terms = _terms(query)
    if not terms:
        raise ValueError(
            f"the query {query!r} has no words to search for; give at least one word "
            "of letters or digits"
        )
    return _index().search(terms, limit)


def _terms(query: str) -> list[str]:
    """The query's distinct words, lowercased, in order, at most ``MAX_TERMS``."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query[:MAX_QUERY_CHARS].lower()):
        seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def _match_expression(terms: Iterable[str], operator: str) -> str:
    # Each word becomes an FTS5 string literal, so nothing the model writes is ever
    # read as query syntax. Words hold no double quotes, but escape anyway.
    quoted = ('"' + term.replace('"', '""') + '"' for term in terms)
    return f" {operator} ".join(quoted)


@dataclass(frozen=True, kw_only=True)
class _Passage:
    source: str
    title: str
    section: str | None
    paragraph: int
    body: str


def _parse(source: str, text: str) -> Iterator[_Passage]:
    """The paragraphs of one corpus file, numbered from 1; headings are not paragraphs."""
    blocks = [" ".join(block.split()) for block in re.split(r"\n\s*\n", text)]
    blocks = [block for block in blocks if block]
    if not blocks:
        return
    title = blocks[0].lstrip("#").strip()
    section: str | None = None
    number = 0
    for block in blocks[1:]:
        if block.startswith("#"):
            section = block.lstrip("#").strip() or None
            continue
        number += 1
        yield _Passage(source=source, title=title, section=section, paragraph=number, body=block)


def _corpus() -> Iterator[_Passage]:
    folder = importlib.resources.files("tasks").joinpath("corpus")
    files = sorted(
        (entry for entry in folder.iterdir() if entry.name.endswith((".txt", ".md"))),
        key=lambda entry: entry.name,
    )
    for entry in files:
        yield from _parse(entry.name, entry.read_text(encoding="utf-8"))


class _Index:
    """An in-memory FTS5 index of passages, safe to share between threads."""

    def __init__(self, passages: Iterable[_Passage]) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        try:
            self._db.execute(
                "CREATE VIRTUAL TABLE passages USING fts5("
                "source UNINDEXED, title, section, paragraph UNINDEXED, body, "
                "tokenize = 'porter unicode61 remove_diacritics 2')"
            )
        except sqlite3.OperationalError as exc:
            self._db.close()
            raise RuntimeError(
                f"the search tool needs SQLite's FTS5 extension, which this Python's "
                f"sqlite3 (SQLite {sqlite3.sqlite_version}) lacks: {exc}"
            ) from None
        with self._db:
            self._db.executemany(
                "INSERT INTO passages (source, title, section, paragraph, body) "
                "VALUES (?, ?, ?, ?, ?)",
                ((p.source, p.title, p.section, p.paragraph, p.body) for p in passages),
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __len__(self) -> int:
        with self._lock:
            (count,) = self._db.execute("SELECT count(*) FROM passages").fetchone()
        return int(count)

    def search(self, terms: list[str], limit: int) -> list[SearchHit]:
        """Passages holding every term, topped up with those holding any term."""
        hits = self._query(_match_expression(terms, "AND"), limit)
        if len(hits) < limit and len(terms) > 1:
            found = {(hit["source"], hit["paragraph"]) for hit in hits}
            some = [term for term in terms if term not in _STOPWORDS] or terms
            for hit in self._query(_match_expression(some, "OR"), limit + len(hits)):
                if len(hits) == limit:
                    break
                if (hit["source"], hit["paragraph"]) not in found:
                    hits.append(hit)
        return hits

    def _query(self, expression: str, limit: int) -> list[SearchHit]:
        sql = (
            "SELECT source, title, section, paragraph, "
            f"snippet(passages, 4, '[', ']', '...', {_SNIPPET_TOKENS}), {_BM25} AS score "
            "FROM passages WHERE passages MATCH ? ORDER BY score LIMIT ?"
        )
        with self._lock:
            rows = self._db.execute(sql, (expression, limit)).fetchall()
        return [
            SearchHit(
                source=source,
                title=title,
                section=section,
                paragraph=int(paragraph),
                snippet=snippet,
                # bm25() is lower for better matches; the model is told higher is better.
                score=round(-float(score), 4),
            )
            for source, title, section, paragraph, snippet, score in rows
        ]


_built: _Index | None = None
_building = threading.Lock()


def _index() -> _Index:
    """This process's index of the corpus, built on first use."""
    global _built
    with _building:
        if _built is None:
            _built = _Index(_corpus())
            atexit.register(_built.close)
        return _built
