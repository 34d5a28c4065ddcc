from __future__ import annotations

from collections.abc import Mapping

import pytest

from clawmem_index.search.query_plan import plan_query
from clawmem_index.search.typo_reading import MAX_MEANT, correct
from clawmem_index.text.stemming import stem


class Vocabulary:
    """An index's stems by prefix, from a word list (the fake of `KeywordPart.vocabulary`), counting reads."""

    def __init__(self, held: dict[str, int]) -> None:
        self.held: dict[str, int] = {}
        for word, chunks in held.items():
            key = stem(word)
            assert key is not None
            self.held[key] = self.held.get(key, 0) + chunks
        self.asked: list[str] = []

    def __call__(self, prefix: str) -> Mapping[str, int]:
        self.asked.append(prefix)
        return {s: n for s, n in self.held.items() if s.startswith(prefix)}


def test_a_word_the_index_lacks_is_read_as_the_words_it_holds_one_typo_away() -> None:
    vocabulary = Vocabulary({"adoption": 8, "caroline": 69, "pottery": 8, "poetry": 2, "staging": 30})
    found = correct(["carolne", "adoptiom", "potery", "stagng"], vocabulary)
    assert [(c.word, c.meant) for c in found] == [("carolne", ("caroline",)), ("adoptiom", ("adoption",)),
                                                   ("potery", ("pottery", "poetry")), ("stagng", ("staging",))]
    assert len(set(vocabulary.asked)) == len(vocabulary.asked), "each block of the vocabulary is read once"


def test_words_the_index_holds_and_words_not_worth_correcting_are_left_alone() -> None:
    vocabulary = Vocabulary({"adoption": 8, "kids": 3, "kid": 2})
    assert correct(["adoption", "adopting", "kid", "a828e60", "2026"], vocabulary) == []  # held, short, ids
    assert [(c.word, c.meant) for c in correct(["kdis", "adoption"], vocabulary)] == [("kdis", ("kids",))]


def test_the_most_common_words_come_first_and_at_most_a_few() -> None:
    vocabulary = Vocabulary({"canes": 5, "cakes": 9, "cases": 30})
    meant = correct(["cajes"], vocabulary)  # j is beside k and n, far from s
    assert meant[0].meant == ("cakes", "canes")
    many = Vocabulary({"stage": 1, "stale": 2, "stake": 3, "state": 4})
    assert correct(["stae"], many)[0].meant == ("state", "stake")[:MAX_MEANT]  # a dropped letter: any of four


def test_a_typo_in_the_first_letter_is_read_when_nothing_else_is_near() -> None:
    vocabulary = Vocabulary({"staging": 3, "identity": 5, "session": 4, "wedding": 2})
    found = [c for word in ("xtaging", "jdentity", "ession", "kwedding", "tsaging")
             for c in correct([word], vocabulary)]
    assert [(c.word, c.meant) for c in found] == [
        ("xtaging", ("staging",)),  # a neighbouring key
        ("jdentity", ("identity",)),
        ("ession", ("session",)),  # the first letter dropped
        ("kwedding", ("wedding",)),  # one too many in front
        ("tsaging", ("staging",)),  # the first two swapped
    ]
    assert correct(["ptaging"], vocabulary) == []  # p is nowhere near s: a different word, not a typo


def test_a_word_that_is_no_typo_does_not_spend_the_reading_of_a_typo_after_it() -> None:
    """The rarer kinds (a letter dropped, the first letter) cost ~26 blocks each: every word has its ordinary reading
    first, then each rarer kind is tried for every word still unexplained, cheapest first."""
    vocabulary = Vocabulary({"identity": 5, "staging": 3})
    found = correct(["zqxwvy", "jdentity", "stagng"], vocabulary)
    assert [(c.word, c.meant) for c in found] == [("jdentity", ("identity",)), ("stagng", ("staging",))]


def test_a_three_letter_word_is_read_only_when_it_is_no_word() -> None:
    vocabulary = Vocabulary({"move": 5, "kids": 3, "cat": 2, "cut": 9})
    assert [(c.word, c.meant) for c in correct(["ove"], vocabulary)] == [("ove", ("move",))]  # "move", first dropped
    assert correct(["cat", "bat"], vocabulary) == []  # words: meant as typed


def test_a_first_letter_typo_comes_after_any_ordinary_one() -> None:
    vocabulary = Vocabulary({"mentors": 3, "dentors": 90})
    assert correct(["mentrs"], vocabulary)[0].meant == ("mentors",)  # "dentors" is further, however common


def test_a_word_already_asked_for_is_not_added_again() -> None:
    vocabulary = Vocabulary({"staging": 3})
    assert correct(["staging", "stagng"], vocabulary) == []


def test_the_plan_adds_the_words_meant_beside_the_typo_and_says_so() -> None:
    vocabulary = Vocabulary({"staging": 3, "server": 5})
    plan = plan_query("stagng server", vocabulary)
    assert plan.match == '"stagng" OR "staging" OR "server"'
    assert plan.as_dict() == {"corrected": [{"word": "stagng", "read_as": ["staging"]}]}
    assert plan_query("stagng server", None).match == '"stagng" OR "server"'  # off
    assert plan_query("stagng server", None).as_dict() == {}


def test_words_in_quotes_are_taken_as_typed() -> None:
    import datetime as dt

    vocabulary = Vocabulary({"staging": 3, "march": 2})
    plan = plan_query('"stagng march 3" notes', vocabulary, dt.date(2026, 11, 28))
    assert plan.dates == () and plan.corrections == ()
    assert plan.match == '"stagng march 3" OR "notes"'


def test_a_quoted_word_is_taken_as_typed() -> None:
    vocabulary = Vocabulary({"adoption": 3})
    assert plan_query('"adoptiom"', vocabulary).corrections == ()
    assert plan_query("“adoptiom” plans", vocabulary).corrections == ()
    assert plan_query("adoptiom plans", vocabulary).corrections[0].meant == ("adoption",)


def test_acronyms_and_ids_typed_with_capitals_inside_are_taken_as_typed() -> None:
    vocabulary = Vocabulary({"dls": 3, "run": 9, "caroline": 5})
    assert plan_query("DLNs and RUNX", vocabulary).corrections == ()
    assert plan_query("dlns and runx", vocabulary).corrections != ()
    assert plan_query("Carolne", vocabulary).corrections[0].meant == ("caroline",)  # a name's capital is its first


def test_a_word_of_the_language_the_index_lacks_is_meant_as_typed() -> None:
    """"host" is not "most" mistyped because the index holds only "most" (LoCoMo: 88 of 1,982 clean questions had a
    real word read as a typo, 10 now); "mosr" is."""
    vocabulary = Vocabulary({"most": 9, "gather": 3, "well": 5, "had": 4})
    assert correct(["host", "father", "sell", "hadn"], vocabulary) == []
    assert [(c.word, c.meant) for c in correct(["mosr", "fathwr"], vocabulary)] == [("mosr", ("most",))]


def test_the_first_part_of_a_contraction_is_not_read_as_a_typo() -> None:
    """"hadn't" is split into "hadn" and "t": "hadn" is a word the language makes, not "had" or "hand" mistyped."""
    vocabulary = Vocabulary({"had": 9, "hand": 4, "couldn": 2, "carolines": 3})
    for query in ("why hadn't she moved", "why hadn\u2019t she moved", "Why HADN'T she moved"):
        assert plan_query(query, vocabulary).corrections == (), query
    assert plan_query("what's Carolne's plan", vocabulary).corrections[0].word == "carolne"  # a possessive may be one


def test_a_dropped_second_letter_is_put_back_when_nothing_else_is_near() -> None:
    vocabulary = Vocabulary({"mentors": 3, "children": 5})
    assert [(c.word, c.meant) for c in correct(["mntors", "cildren"], vocabulary)] == \
        [("mntors", ("mentors",)), ("cildren", ("children",))]
    near = Vocabulary({"finds": 4, "friends": 9})
    assert correct(["fiends"], near)[0].meant == ("finds",), "a word one ordinary typo away comes first"


def test_a_query_of_many_unknown_words_reads_a_bounded_part_of_the_vocabulary() -> None:
    """64 words the index lacks: at most MAX_TYPOS are looked for as typos, MAX_BLOCKS blocks read and MAX_LOOKUPS
    stems looked up; a word past the budget is left as typed."""
    from clawmem_index.search.typo_reading import MAX_BLOCKS, MAX_LOOKUPS, MAX_TYPOS

    vocabulary = Vocabulary({"adoption": 8, "caroline": 69, "pottery": 8, "staging": 30})
    unknown = [f"{a}{b}xqzv" for a in "bdfghjklmnprstvw" for b in "aeiou"][:64]
    found = correct(["carolne", "adoptiom", *unknown, "potery", "stagng"], vocabulary)
    assert [c.word for c in found] == ["carolne", "adoptiom"]  # the first words read; the last two past the budget
    assert len(vocabulary.asked) <= MAX_BLOCKS + MAX_LOOKUPS and len(found) <= MAX_TYPOS


def test_a_date_the_index_has_no_note_near_is_asked_about_once() -> None:
    import datetime as dt

    asked = []

    def dated(mention: object) -> bool:
        asked.append(mention)
        return False

    plan = plan_query("March 3 " * 20 + "yesterday", None, dt.date(2026, 11, 28), dated)
    assert plan.dates == () and len(asked) == 2  # March 3 once, yesterday once


def test_the_query_s_other_words_tell_a_typo_s_readings_apart() -> None:
    """"fead" is one key from "fear" and "read": beside "books" it is read as the word the chunks about books hold,
    however much more common the other; alone, the most common comes first."""
    vocabulary = Vocabulary({"fear": 40, "read": 6, "feed": 9, "book": 5})
    about_books = [{"book", "read", "shelf"}, {"book", "fear"}, {"read", "novel"}]
    asked: list[list[str]] = []

    def context(typos: object) -> list[set[str]]:
        asked.append(sorted(typos))  # type: ignore[call-overload]
        return about_books

    assert correct(["fead"], vocabulary)[0].meant == ("fear",)
    assert correct(["fead", "books"], vocabulary, context)[0].meant == ("read", "fear")  # 2 of 6 chunks, 1 of 40
    assert asked == [["fead"]], "the context is asked once, told which words are typos"
    assert correct(["books"], vocabulary, context) == [] and len(asked) == 1, "no typo: no context read"


def test_beside_other_words_a_first_letter_typo_is_weighed_with_the_ordinary_ones() -> None:
    """"ove" is "over" one ordinary typo away and "move" with its first letter dropped: the chunks the question's
    other words find hold "move", and "over" is in every chunk, so "move" is the more telling."""
    vocabulary = Vocabulary({"over": 90, "move": 4, "house": 3})
    chunks = [{"move", "house", "over"}, {"house", "move"}, {"over", "hous"}]
    assert correct(["ove"], vocabulary)[0].meant == ("over",)  # alone: the ordinary reading, as before
    assert correct(["ove", "house"], vocabulary, lambda typos: chunks)[0].meant == ("move", "over")
    assert correct(["ove", "house"], vocabulary, lambda typos: [{"house"}])[0].meant == ("over",), \
        "none of the readings beside the other words: the likeliest kind of typo"


def test_the_plan_asks_the_index_for_the_chunks_its_other_words_find() -> None:
    vocabulary = Vocabulary({"fear": 40, "read": 6, "book": 5})
    asked: list[list[str]] = []

    def found_by(words: list[str]) -> list[set[str]]:
        asked.append(words)
        return [{"book", "read"}]

    plan = plan_query("which books did she fead", vocabulary, found_by=found_by)
    assert [c.meant for c in plan.corrections] == [("read",)] and asked == [["books"]]
    assert plan_query("fead", vocabulary, found_by=found_by).corrections[0].meant == ("fear",)
    assert asked == [["books"]], "a query of typos alone has no other words to ask with"


def test_with_a_context_the_reading_still_stays_inside_its_budget() -> None:
    """Every kind of reading is looked up for every typo when the query has other words: still at most MAX_BLOCKS
    blocks and MAX_LOOKUPS stems, whatever the query."""
    from clawmem_index.search.typo_reading import MAX_BLOCKS, MAX_LOOKUPS

    vocabulary = Vocabulary({"adoption": 8, "caroline": 69, "pottery": 8, "staging": 30, "notes": 3})
    unknown = [f"{a}{b}xqzv" for a in "bdfghjklmnprstvw" for b in "aeiou"][:64]
    found = correct(["carolne", *unknown, "adoptiom", "notes"], vocabulary, lambda typos: [{"note", "adopt"}])
    assert [c.word for c in found] == ["carolne"]
    assert len(vocabulary.asked) <= MAX_BLOCKS + MAX_LOOKUPS


def test_a_date_a_typo_hid_is_read_once_the_typo_is() -> None:
    """"camping in kune": the typo is read as "june", and the query is read for dates again as meant, so it is
    dated as the clean question is and "june" is no keyword (a note of that June rarely says "june")."""
    import datetime as dt

    vocabulary = Vocabulary({"june": 4, "camping": 6, "melanie": 9})
    today = dt.date(2023, 8, 1)
    clean = plan_query("When did Melanie go camping in June?", vocabulary, today)
    typed = plan_query("When did Melanie go camping in kune?", vocabulary, today)
    assert [c.as_dict() for c in typed.corrections] == [{"word": "kune", "read_as": ["june"]}]
    assert [(m.first, m.last) for m in typed.dates] == [(m.first, m.last) for m in clean.dates] \
        == [(dt.date(2023, 6, 1), dt.date(2023, 6, 30))]
    assert typed.match == clean.match and "june" not in typed.match and "kune" not in typed.match
    assert typed.as_dict()["dates"] == [{"text": "in june", "from": "2023-06-01", "to": "2023-06-30"}]


def test_a_typo_that_hides_no_date_keeps_the_plan_as_it_was() -> None:
    import datetime as dt

    vocabulary = Vocabulary({"staging": 3, "server": 5})
    plan = plan_query("stagng server yesterday", vocabulary, dt.date(2026, 11, 28))
    assert plan.match == '"stagng" OR "staging" OR "server"'
    assert [m.text for m in plan.dates] == ["yesterday"] and plan.words == "stagng server"


def test_a_typo_whose_reading_is_no_date_word_costs_no_second_read_for_dates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The query is read for dates again only when a typo's reading may be part of one: a date of words the query
    holds as typed is already read, and one word read right cannot make a date of others unless it is a date word."""
    import datetime as dt

    import clawmem_index.search.query_plan as query_plan

    read: list[str] = []
    real = query_plan.find_dates
    monkeypatch.setattr(query_plan, "find_dates", lambda query, today: read.append(query) or real(query, today))
    vocabulary = Vocabulary({"staging": 3, "server": 5, "during": 4, "may": 2})
    plan_query("stagng server", vocabulary, dt.date(2026, 11, 28))
    assert read == ["stagng server"]
    read.clear()
    plan = plan_query("the release durimg May", vocabulary, dt.date(2026, 11, 28))
    assert read == ["the release durimg May", "the release during May"]  # "during" makes "May" a month
    assert [m.text for m in plan.dates] == ["during May"]
