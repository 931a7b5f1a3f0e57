from __future__ import annotations

import re
from importlib.resources import files

import pytest

from executor.schema import function_schema
from tasks.fulltext import MAX_TERMS, _Index, _parse, _terms, search


def test_search_finds_the_fable_a_query_describes() -> None:
    hits = search("fox grapes")

    assert hits[0]["source"] == "aesops-fables.txt"
    assert hits[0]["section"] == "The Fox and the Grapes"
    assert "[Fox]" in hits[0]["snippet"] and "[Grapes]" in hits[0]["snippet"]


def _text_of(source: str, paragraph: int) -> str:
    text = files("tasks").joinpath("corpus", source).read_text(encoding="utf-8")
    (passage,) = (p for p in _parse(source, text) if p.paragraph == paragraph)
    return passage.body.lower()


def test_search_ranks_passages_with_every_word_above_those_with_some() -> None:
    words = ("irene", "adler", "photograph")

    hits = search(" ".join(words), limit=10)

    has_all = [all(w in _text_of(h["source"], h["paragraph"]) for w in words) for h in hits]
    assert has_all == sorted(has_all, reverse=True)
    assert 0 < sum(has_all) < len(hits) == 10


def test_search_orders_hits_of_one_kind_by_descending_score() -> None:
    hits = search("pawnbroker Wilson", limit=20)

    both = [
        h["score"] for h in hits if "[Wilson]" in h["snippet"] and "[pawnbroker]" in h["snippet"]
    ]
    assert both == sorted(both, reverse=True)


def test_search_returns_source_title_section_paragraph_snippet_and_score() -> None:
    (hit,) = search("four score and seven years", limit=1)

    assert hit == {
        "source": "gettysburg-address.txt",
        "title": "The Gettysburg Address, by Abraham Lincoln (November 19, 1863)",
        "section": None,
        "paragraph": 1,
        "snippet": hit["snippet"],
        "score": hit["score"],
    }
    assert "[Four] [score] [and] [seven] [years]" in hit["snippet"]
    assert hit["score"] > 0


def test_search_matches_word_endings_and_ignores_case() -> None:
    hits = search("FOXES", limit=3)

    assert len(hits) == 3
    assert all("[fox" in h["snippet"].lower() for h in hits)


def test_search_returns_at_most_limit_hits() -> None:
    assert len(search("the", limit=1)) == 1
    assert len(search("the", limit=20)) == 20
    assert len(search("the")) == 5


def test_search_returns_an_empty_list_when_no_passage_has_the_words() -> None:
    assert search("xylophone quasar") == []


@pytest.mark.parametrize(
    "query",
    [
        '"foo AND (',
        "fox AND (grapes OR",
        "NEAR(fox grapes, 2)",
        "body:fox",
        "fox*",
        "^fox",
        "-fox +grapes",
        '"unterminated',
        "fox\"'`;--",
        "Füchse über alles",
        "NOT",
        "🦊 fox",
        " ".join(["word"] * 400),
    ],
)
def test_search_treats_query_syntax_from_the_model_as_plain_words(query: str) -> None:
    hits = search(query)

    assert isinstance(hits, list)


@pytest.mark.parametrize("query", ["", "   ", "?!", '"()*', "___"])
def test_search_rejects_a_query_without_words(query: str) -> None:
    with pytest.raises(ValueError, match="no words to search for"):
        search(query)


def test_query_words_are_lowercased_deduplicated_and_capped() -> None:
    assert _terms("The fox, the FOX and (the) grapes") == ["the", "fox", "and", "grapes"]
    assert len(_terms(" ".join(f"w{i}" for i in range(100)))) == MAX_TERMS


def test_corpus_files_parse_into_titled_numbered_paragraphs_under_their_sections() -> None:
    text = "# A Title\n\nFirst  paragraph\nwrapped.\n\n## One\n\nSecond.\n\n\n\nThird.\n"

    passages = list(_parse("x.md", text))

    assert [(p.title, p.section, p.paragraph, p.body) for p in passages] == [
        ("A Title", None, 1, "First paragraph wrapped."),
        ("A Title", "One", 2, "Second."),
        ("A Title", "One", 3, "Third."),
    ]


def test_an_index_can_be_built_from_any_passages_and_closed() -> None:
    index = _Index(_parse("tiny.txt", "Tiny\n\nThe quick brown fox.\n\nA lazy dog."))
    try:
        assert len(index) == 2
        (hit,) = index.search(["dog"], 5)
        assert hit["paragraph"] == 2
        assert hit["snippet"] == "A lazy [dog]."
    finally:
        index.close()


def test_corpus_holds_a_few_hundred_paragraphs_of_real_text() -> None:
    folder = files("tasks").joinpath("corpus")
    passages = [
        passage
        for entry in folder.iterdir()
        if entry.name.endswith((".txt", ".md"))
        for passage in _parse(entry.name, entry.read_text(encoding="utf-8"))
    ]

    assert len(passages) >= 300
    assert len({p.source for p in passages}) >= 5


def test_search_description_names_every_work_in_the_corpus() -> None:
    description = function_schema(search, name="search").description
    folder = files("tasks").joinpath("corpus")

    for entry in folder.iterdir():
        if entry.name.endswith((".txt", ".md")):
            title = entry.read_text(encoding="utf-8").strip().splitlines()[0].lstrip("# ")
            work = re.split(r",\s", title)[0].removeprefix("The ")
            assert work in description, f"name {work!r} in the docstring of search()"


def test_search_schema_bounds_the_limit_and_describes_both_arguments() -> None:
    parameters = function_schema(search, name="search").parameters

    limit = parameters["properties"]["limit"]
    assert (limit["minimum"], limit["maximum"], limit["default"]) == (1, 20, 5)
    assert parameters["required"] == ["query"]
    assert all(p.get("description") for p in parameters["properties"].values())
