"""The synthetic story corpus: deterministic, rich, and internally consistent."""

from __future__ import annotations

import collections
import random
import re

from data_prep import lexicon as L
from data_prep import synthetic as S

WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def _story_with_cast(seed: int, index: int) -> tuple[S.Story, str, str]:
    """Re-run the generator for story `index`, keeping the Story object to check it against the text."""
    rng = random.Random(f"rrtrain-stories:{seed}:{index}")
    s = S.Story(rng)
    plot = rng.choice(S.PLOTS)
    plot(s)
    return s, plot.__name__, s.text()


def test_same_seed_same_corpus_other_seed_other_corpus():
    a = list(S.StoryCorpus(50, seed=7))
    assert a == list(S.StoryCorpus(50, seed=7))
    assert a[10] == S.story(7, 10)  # each story is independent of the others
    b = list(S.StoryCorpus(50, seed=8))
    assert sum(x == y for x, y in zip(a, b)) == 0


def test_thousands_of_distinct_words_and_every_plot():
    docs = list(S.StoryCorpus(2000, seed=0))
    counts = collections.Counter(w.lower() for d in docs for w in WORD.findall(d))
    assert len(counts) >= 2000, len(counts)
    lengths = [len(WORD.findall(d)) for d in docs]
    assert 80 <= sum(lengths) / len(lengths) <= 400
    assert len(set(docs)) == len(docs)
    plots = collections.Counter(_story_with_cast(0, i)[1] for i in range(300))
    assert set(plots) == {p.__name__ for p in S.PLOTS}


def test_cast_place_and_object_recur_and_there_is_dialogue():
    for i in range(200):
        s, plot, text = _story_with_cast(3, i)
        assert text.count(s.hero.name) >= 3, (plot, text)
        assert text.count('"') >= 4, (plot, text)  # at least two quoted lines
        words = set(WORD.findall(text.lower()))
        assert {s.hero.he, s.hero.his, s.hero.him} & words, text  # the hero is referred to by pronoun
        if plot in ("plot_lost", "plot_broken", "plot_stuck", "plot_share"):
            assert text.count(s.obj) >= 3, (plot, text)
        if plot in ("plot_lost", "plot_share", "plot_race", "plot_explore"):
            assert text.count(s.friend.name) >= 2, (plot, text)


def test_plots_are_causally_consistent():
    """What happens later follows from what happened earlier (this is what a model can learn)."""
    seen = collections.Counter()
    for i in range(400):
        s, plot, text = _story_with_cast(5, i)
        if plot == "plot_broken":
            broke, tool, mended = L.MEND[s.material]
            assert f"{s.obj} {broke}" in text and tool in text and f"{mended} the {s.obj}" in text, text
            seen[plot] += 1
        elif plot == "plot_lost":
            # found next to the feature where it was put down, back at the same place
            put = re.search(r"put the .+? down next to (.+?)\.", text)
            assert put and "I put it down next to" in text and s.to_place in text, text
            seen[plot] += 1
        elif plot == "plot_bake":
            dish = re.search(r"wanted to make (.+?) for", text).group(1)
            ingredients = L.phrases(L.RECIPES[dish][0])
            assert all(x in text for x in ingredients), text
            seen[plot] += 1
        elif plot == "plot_fear":
            fear = re.search(r"was afraid of (.+?)\.", text).group(1)
            assert L.FEARS[fear][1] in text.lower() or L.FEARS[fear][1][:20].lower() in text.lower(), text
            seen[plot] += 1
    assert min(seen.values()) >= 10, seen
