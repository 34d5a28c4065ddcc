from __future__ import annotations

from clawmem_index.text.spelling import NEIGHBOURS, correctable, edits
from clawmem_index.text.stemming import stem, stems


def test_the_typos_people_make_are_one_edit_away() -> None:
    found = set(edits("adoption"))
    assert {"adoptin", "adopion", "doption"} <= found  # a letter dropped (the right word had one more)
    assert {"adooption", "adoptiton"} <= found  # one too many
    assert {"aodption", "adoptoin"} <= found  # two swapped
    assert {"adoptiom", "sdoption", "adiption"} <= found  # a key beside the right one
    assert "adoption" not in found


def test_a_letter_changed_into_one_far_away_on_the_keyboard_is_not_a_typo() -> None:
    assert "p" not in NEIGHBOURS["m"] and "grandpa" not in edits("grandma")
    assert "hike" not in edits("hide") and "hid" in edits("hide")
    assert set(NEIGHBOURS["g"]) == set("fhrtyvbn")


def test_letters_not_on_the_keyboard_are_changed_into_the_words_own() -> None:
    assert "zürich" in edits("zürcih")  # swapped
    assert "мама" in edits("мааа")  # a letter of the word, in place of another
    assert "мапа" not in edits("мааа")  # not a letter it lacks


def test_only_words_of_letters_long_enough_are_corrected() -> None:
    assert correctable("staging") and correctable("kids") and correctable("ove")  # "ove": a dropped first letter
    assert not correctable("ki") and not correctable("a828e60") and not correctable("2026") \
        and not correctable("x" * 40)


def test_words_are_stemmed_as_the_keyword_index_keeps_them() -> None:
    assert stem("deployment") == "deploy" and stem("deploy") == "deploi"  # porter, as FTS5 has it
    assert stem("Zürich") == "zurich"  # diacritics removed
    assert stem("two words") is None
    words = edits("memroy")
    assert stems(words) == [stem(w) for w in words]
    assert stems(["a-b", "staging"]) == [None, "stage"]  # not one word each: one at a time


def test_a_word_fts5_splits_has_no_stem_among_others() -> None:
    assert stems(["ab\u19b0cd", "\u19b0" * 4, "tests"]) == [None, None, "test"]  # U+19B0: a letter, an FTS5 separator
