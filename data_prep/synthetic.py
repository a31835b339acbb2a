"""`synthetic:stories`: a seeded generator of short children's stories, the embedded default corpus.

The paper trains on TinyStories, which cannot be downloaded without network, so this stands in for
it. Each story has a cast (a hero, a friend, a grown-up, sometimes a pet), a place and an object
that recur through the story; one of ten plots whose later sentences depend on earlier ones (the
object's material decides how it breaks and how it is mended, the place decides what is seen, a lost
thing is found where the story says it was dropped); and dialogue. Story `i` depends only on
(seed, i), so any document can be regenerated on its own and the corpus is identical for a seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterator

from data_prep import lexicon as L


def cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def a_an(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def join_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass(frozen=True)
class Person:
    """A character: how to name them and which pronouns agree with them."""

    name: str
    kind: str  # girl, boy, or an animal name
    he: str

    @property
    def his(self) -> str:
        return {"he": "his", "she": "her"}[self.he]

    @property
    def him(self) -> str:
        return {"he": "him", "she": "her"}[self.he]

    @property
    def He(self) -> str:
        return cap(self.he)

    @property
    def His(self) -> str:
        return cap(self.his)


class Story:
    """One story under construction: its random source, cast, and the sentences so far."""

    def __init__(self, rng: random.Random) -> None:
        self.r = rng
        self.lines: list[str] = []
        self.hero = self._character()
        self.friend = self._character(avoid=self.hero.name)
        fam, fam_he = rng.choice(L.FAMILY)
        self.elder = Person(fam, "grown-up", fam_he)
        self.place = rng.choice(list(L.PLACES))
        self.prep, feats, acts = L.PLACES[self.place]
        self.to_place = "to school" if self.place == "school" else f"to the {self.place}"
        self.features = L.phrases(feats)
        self.activities = L.phrases(acts)
        self.obj = rng.choice(list(L.OBJECTS))
        self.material, self.can_stick, self.floats, adjs = L.OBJECTS[self.obj]
        self.obj_adj = rng.choice(L.phrases(adjs))
        self.town = rng.choice(L.TOWN_STARTS) + rng.choice(L.TOWN_ENDS)
        self.weather = rng.choice(list(L.WEATHER))

    # -- cast -----------------------------------------------------------------------------------
    def _name(self, girl: bool) -> str:
        r = self.r
        if r.random() < 0.25:
            return r.choice(L.NAME_ONSETS) + r.choice(L.NAME_CODAS)
        return r.choice(L.GIRL_NAMES if girl else L.BOY_NAMES)

    def _character(self, avoid: str = "") -> Person:
        r = self.r
        for _ in range(20):
            if r.random() < 0.7:
                girl = r.random() < 0.5
                p = Person(self._name(girl), "girl" if girl else "boy", "she" if girl else "he")
            else:
                animal = r.choice(list(L.ANIMALS))
                p = Person(r.choice(L.PET_NAMES), animal, r.choice(["he", "she"]))
            if p.name != avoid:
                return p
        return Person(avoid + "ie", "girl", "she")

    def intro_of(self, p: Person) -> str:
        trait = self.r.choice(L.TRAITS)
        size = self.r.choice(L.SIZES) + " " if self.r.random() < 0.4 else ""
        return f"{a_an(size + trait)} {p.kind} named {p.name}"

    # -- sentence helpers -------------------------------------------------------------------------
    def say(self, who: Person | str, line: str, verb: str | None = None) -> None:
        name = who.name if isinstance(who, Person) else who
        verb = verb or ("asked" if line.endswith("?") else self.r.choice(["said", "said", "replied", "added", "called", "whispered"]))
        if self.r.random() < 0.5:
            self.lines.append(f'"{line[:-1]}," {verb} {name}.' if line.endswith(".") else f'"{line}" {verb} {name}.')
        else:
            self.lines.append(f'{cap(name)} {verb}, "{line}"')

    def add(self, *sentences: str) -> None:
        self.lines.extend(cap(s) for s in sentences)

    def pick(self, options: list[str]) -> str:
        return self.r.choice(options)

    def feel(self, p: Person, mood: str) -> str:
        return f"{p.name} {self.r.choice(L.FEELINGS[mood])}"

    def the_obj(self) -> str:
        return f"the {self.obj_adj} {self.obj}"

    def text(self) -> str:
        out: list[str] = []
        para: list[str] = []
        for line in self.lines:
            if line == "\n":
                if para:
                    out.append(" ".join(para))
                para = []
            else:
                para.append(line)
        if para:
            out.append(" ".join(para))
        return "\n".join(out)

    def para(self) -> None:
        self.lines.append("\n")

    # -- shared openings and endings -------------------------------------------------------------
    def opening(self) -> None:
        h, r = self.hero, self.r
        opening = self.pick(L.OPENINGS)
        v = r.randrange(3)
        if v == 0:
            self.add(f"{opening}, there was {self.intro_of(h)}.",
                     f"{h.He} lived in {self.town} with {h.his} {self.elder.name.lower() if self.elder.name in ('Mom', 'Dad') else 'family'}.")
        elif v == 1:
            self.add(f"{opening}, {self.intro_of(h)} woke up early.",
                     f"{h.He} looked out of the window and saw that {L.WEATHER[self.weather][0]}.")
        else:
            self.add(f"In the town of {self.town} lived {self.intro_of(h)}.",
                     f"{h.His} best friend was {self.intro_of(self.friend)}.")
        self.add(self.pick([
            f"{h.name} had {a_an(self.obj_adj)} {self.obj} and loved it very much.",
            f"{h.His} favorite thing in the whole world was {a_an(self.obj_adj)} {self.obj}.",
            f"{h.name} took {h.his} {self.obj_adj} {self.obj} everywhere.",
        ]))

    def visit_place(self, who: str) -> None:
        feats = self.r.sample(self.features, 3)
        self.add(self.pick([
            f"{who} went {self.to_place}.",
            f"One day {who} walked {self.to_place}.",
            f"{cap(self.elder.name)} took {who} {self.to_place}.",
        ]), self.pick([
            f"There were {join_list(feats)}.",
            f"{cap(self.prep)} they saw {join_list(feats)}.",
            f"They loved the {self.place} because it had {join_list(feats)}.",
        ]))

    def ending(self, lesson_key: str) -> None:
        h = self.hero
        lesson = self.pick(L.LESSONS[lesson_key])
        v = self.r.randrange(3)
        self.para()
        if v == 0:
            self.say(self.elder, cap(lesson) + ".")
        elif v == 1:
            self.add(f"That day {h.name} learned that {lesson}.")
        else:
            self.add(f"From then on, {h.name} always remembered that {lesson}.")
        self.add(self.pick([
            f"{h.name} and {self.friend.name} smiled, and they played together until the sun went down.",
            f"That night, {h.name} fell asleep with a big smile.",
            f"And {h.name} was the happiest {h.kind} in {self.town}.",
            "The end.",
        ]))


# -- plots: each uses the cast, the place and the object consistently -------------------------------
def plot_lost(s: Story) -> None:
    h, f, e, r = s.hero, s.friend, s.elder, s.r
    spots = r.sample(L.SEARCH_SPOTS, 4)
    drop_act = s.pick(s.activities)
    s.opening()
    s.visit_place(f"{h.name} and {f.name}")
    s.add(f"They {drop_act}, and {h.name} put {s.the_obj()} down next to {s.pick(s.features)}.")
    s.para()
    s.add(f"When it was time to go home, {h.name} looked for {h.his} {s.obj}, but it was gone!")
    s.add(f"{s.feel(h, 'sad')}.")
    s.say(h, f"Where is my {s.obj}?")
    s.say(f, s.pick(["Don't worry, we will find it together.", "Let's look everywhere!", "I will help you look."]))
    for spot in spots[:2]:
        s.add(f"They looked {spot}, but the {s.obj} was not there.")
    s.say(e, s.pick([f"Where did you last see it, {h.name}?", "Think about where you had it last.", "Let's think. Where were you playing?"]))
    s.add(f"{h.name} thought hard.", f"Then {h.he} remembered the {s.place}, where they {drop_act}.")
    s.say(h, f"I put it down next to {s.pick(s.features)}!", "shouted")
    s.add(f"They ran back {s.to_place}.", f"There was {s.the_obj()}, right where {h.name} had left it.")
    s.add(f"{s.feel(h, 'happy')} and hugged {h.his} {s.obj}.")
    s.say(h, f"Thank you, {f.name}!")
    s.ending("lost")


def plot_broken(s: Story) -> None:
    h, f, e = s.hero, s.friend, s.elder
    broke, tool, mended = L.MEND[s.material]
    s.opening()
    s.visit_place(f"{h.name}")
    s.add(f"{h.name} {s.pick(s.activities)}.")
    how = s.pick([f"{h.he} tripped over a root", f"{f.name} bumped into {h.him} by accident", f"{h.he} dropped it", "a gust of wind knocked it over"])
    s.add(f"But then {how}, and {s.the_obj()} {broke}!")
    s.add(f"{s.feel(h, 'sad')}.", f"Big tears rolled down {h.his} cheeks.")
    s.say(h, f"My {s.obj} is ruined!", "cried")
    s.para()
    s.add(f"{h.name} carried the {s.obj} home to {e.name}.")
    s.say(e, s.pick([f"Let me see. I think we can fix it with {tool}.", f"Don't cry. All we need is {tool}.", f"Hmm. {cap(tool)} will do the trick."]))
    s.add(f"{e.name} fetched {tool}.", f"{e.He} showed {h.name} how to do it, and together they {mended} the {s.obj}.")
    s.add(f"It took a long time, but {h.name} was patient.")
    s.add(f"When they were done, the {s.obj} looked almost as good as new.")
    s.say(h, s.pick([f"My {s.obj} is back!", f"You fixed my {s.obj}!", "It is even better than before!"]), "cheered")
    if h.name != f.name:
        s.say(f, s.pick([f"I am sorry I bumped into you, {h.name}.", "Can I play with it too?", "It looks wonderful."]))
    s.ending("broken")


def plot_stuck(s: Story) -> None:
    h, f, e, r = s.hero, s.friend, s.elder, s.r
    high = s.pick(L.HIGH_SPOTS)
    animal = r.choice(["bird", "squirrel", "monkey", "cat", "owl", "goat"])
    plural, young, sound, moves, food, home = L.ANIMALS[animal]
    s.opening()
    s.add(f"On a {L.WEATHER['windy'][1]} day, {h.name} and {f.name} played with the {s.obj} in the {s.pick(['garden', 'park', 'backyard', 'field'])}.")
    s.add(f"Suddenly a strong gust of wind took the {s.obj} and it landed {high}!")
    s.say(h, f"Oh no! My {s.obj} is stuck!", "cried")
    s.add(f"{h.name} jumped as high as {h.he} could, but {h.he} was too small.")
    s.add(f"{f.name} found a long stick and tried to poke it down, but the stick was too short.")
    s.para()
    if r.random() < 0.5:
        s.add(f"Just then, {a_an(animal)} {moves} by and {sound}.")
        s.say(h, f"Little {animal}, can you help us get my {s.obj}?")
        s.add(f"The {animal} {moves} up, nudged the {s.obj}, and it fell down into {h.name}'s arms.")
        s.add(f"To say thank you, {h.name} gave the {animal} {food}.")
    else:
        s.add(f"{h.name} ran to get {e.name}.", f"{e.name} came with a tall ladder.")
        s.say(e, "Hold the ladder steady, please.")
        s.add(f"{h.name} and {f.name} held it tight while {e.name} climbed up and reached the {s.obj}.")
        s.add(f"{e.He} carefully climbed down and handed the {s.obj} to {h.name}.")
    s.add(f"{s.feel(h, 'happy')}.")
    s.say(h, "Thank you for helping me!")
    s.ending("stuck")


def plot_fear(s: Story) -> None:
    h, f, e, r = s.hero, s.friend, s.elder, s.r
    fear = r.choice(list(L.FEARS))
    trigger, reassure, action, outcome = L.FEARS[fear]
    s.opening()
    s.add(f"But {h.name} was afraid of {fear}.")
    s.add(f"One day {trigger}, and {s.feel(h, 'scared')}.")
    s.say(h, f"I don't like {fear}!", "whispered")
    s.para()
    s.add(f"{e.name} sat down next to {h.name} and held {h.his} hand.")
    s.say(e, f"{cap(reassure)}.")
    s.say(h, "Are you sure?")
    s.say(e, s.pick(["Let's try together. I will stay right here.", "I am sure. You are braver than you think.", "Take a deep breath. I am with you."]))
    s.add(f"So {h.name} {action}.", f"And {outcome}.")
    s.add(f"{s.feel(h, 'proud')}.")
    s.say(h, f"I am not afraid of {fear} anymore!", "said")
    s.add(f"{h.He} told {f.name} all about it the next day, and {f.name} thought {h.name} was very brave.")
    s.ending("fear")


def plot_share(s: Story) -> None:
    h, f, e = s.hero, s.friend, s.elder
    s.opening()
    s.visit_place(f"{h.name} and {f.name}")
    s.add(f"{h.name} brought {s.the_obj()}.")
    s.say(f, f"Can I play with your {s.obj}?")
    s.say(h, "No, it is mine!", "said")
    s.add(f"{f.name} grabbed the {s.obj} and {h.name} pulled it back.", "They both pulled and pulled.")
    s.say(f, "You never share!", "shouted")
    s.add(f"{s.feel(f, 'angry')} and walked away.", f"Now {h.name} had the {s.obj}, but {h.he} had no one to play with.")
    s.para()
    s.add(f"{e.name} saw what happened.")
    s.say(e, f"{h.name}, is it fun to play alone?")
    s.say(h, "No, it is not fun at all.", "said")
    s.say(e, "Maybe you could take turns.")
    s.add(f"{h.name} walked over to {f.name}.")
    s.say(h, f"I am sorry, {f.name}. Do you want to take turns with my {s.obj}?")
    s.say(f, "Yes! Thank you!")
    s.add(f"They took turns with the {s.obj} and then {s.pick(s.activities)} together.", "It was much more fun than playing alone.")
    s.ending("share")


def plot_animal(s: Story) -> None:
    h, e, r = s.hero, s.elder, s.r
    animal = r.choice([a for a in L.ANIMALS if a not in ("dragon", "unicorn", "whale", "elephant")])
    plural, young, sound, moves, food, home = L.ANIMALS[animal]
    trouble = r.randrange(3)
    s.opening()
    s.visit_place(h.name)
    s.add(f"Near {s.pick(s.features)}, {h.name} heard a tiny sound.", f"It was a little {young}, and it {sound} sadly.")
    if trouble == 0:
        s.add(f"The {young} was lost and could not find its mother.")
        s.say(h, f"Poor little {young}. I will help you find your mother.")
        s.add(f"{h.name} asked {e.name} where {plural} live.")
        s.say(e, f"{cap(plural)} live in {home}. Let's look there.")
        s.add(f"They walked slowly and the {young} {moves} behind them.", f"At last they found {home}, and there was the mother {animal}!")
        s.add(f"The mother {animal} {sound} happily and the {young} {moves} to her.")
    elif trouble == 1:
        s.add(f"The {young} looked very hungry.")
        s.say(h, f"What do {plural} eat?")
        s.say(e, f"{cap(plural)} like {food}.")
        s.add(f"{h.name} brought {food}.", f"The {young} ate it all up and {sound} with joy.")
        s.add(f"Then the {young} {moves} back to {home}.")
    else:
        s.add(f"The {young} had hurt its leg and could not move.")
        s.say(h, f"{e.name}, the {young} is hurt!", "cried")
        s.add(f"{e.name} wrapped the {young} in a soft towel and they took it to the animal doctor.")
        s.say("the doctor", f"With rest and {food}, this {young} will be fine.")
        s.add(f"{h.name} looked after the {young} for a week.", f"When it was strong again, they took it back to {home} and waved goodbye.")
    s.add(f"{s.feel(h, 'happy')}.")
    s.say(h, f"Goodbye, little {young}!")
    s.ending("animal")


def plot_bake(s: Story) -> None:
    h, f, e, r = s.hero, s.friend, s.elder, s.r
    dish = r.choice(list(L.RECIPES))
    ingredients, steps = (L.phrases(x) for x in L.RECIPES[dish])
    mistake, consequence, fix = r.choice(L.MISHAPS)
    s.opening()
    s.add(f"One day {h.name} wanted to make {dish} for {f.name}.")
    s.say(h, f"{e.name}, can we make {dish}?")
    s.say(e, "Yes! First we need to find everything.")
    s.add(f"They put {join_list(ingredients)} on the kitchen table.")
    s.para()
    for step in steps[:3]:
        s.add(f"{s.pick(L.TIMEWORDS)} they {step}.")
    s.add(f"But {h.name} {mistake}, and {consequence}.")
    s.say(h, "Oh no! I spoiled it!", "cried")
    s.say(e, "Everyone makes mistakes. We can fix it.")
    s.add(f"So they {fix}.")
    for step in steps[3:]:
        s.add(f"{s.pick(L.TIMEWORDS)} they {step}.")
    s.add(f"The {dish} smelled wonderful.")
    s.para()
    s.add(f"{h.name} took the {dish} to {f.name}.")
    s.say(f, f"Did you make this {dish} yourself?")
    s.say(h, f"{e.name} helped me, and I {mistake} once, but we fixed it!")
    s.add(f"They ate the {dish} together {s.prep}, and it was delicious.")
    s.ending("bake")


def plot_weather(s: Story) -> None:
    h, f, e, r = s.hero, s.friend, s.elder, s.r
    bad = r.choice(["rainy", "snowy", "windy", "foggy"])
    s.opening()
    s.add(f"Today {h.name} and {f.name} had a plan.", f"They wanted to go {s.to_place}.",
          f"Last time they {s.pick(s.activities)}, and they wanted to do it again.")
    s.add(f"{h.name} packed {s.the_obj()} and a basket of {s.pick(L.FOODS)} sandwiches.")
    s.add(f"But when they opened the door, {L.WEATHER[bad][0]}.", f"It was {L.WEATHER[bad][1]} outside.")
    s.say(h, f"Now we cannot go {s.to_place}!", "sighed")
    s.add(f"{s.feel(f, 'sad')}.")
    s.para()
    s.say(e, s.pick(["Why don't you bring the fun inside?", "We can still have an adventure at home.", "Let's make a plan for a day like this."]))
    indoor = s.pick(["built a blanket fort in the living room", "had a picnic on the living room rug", "painted a picture of the place they wanted to visit",
                     "made a pretend trip with chairs for a train", "played hide and seek in the house"])
    s.add(f"So they {indoor}.", f"They played with {s.the_obj()} and ate their sandwiches.")
    s.say(f, "This is the best day ever!", "laughed")
    calm = {"rainy": "the rain stopped", "snowy": "the snow stopped falling", "windy": "the wind calmed down", "foggy": "the fog lifted"}[bad]
    s.add(f"Later {calm} and the sun came out.")
    if bad == "rainy":
        s.add("A big rainbow stretched across the sky.")
    s.add(f"They went {s.to_place} after all and {s.pick(s.activities)}.")
    s.ending("weather")


def plot_race(s: Story) -> None:
    h, f, e, r = s.hero, s.friend, s.elder, s.r
    goal = s.pick(L.RACE_PLACES)
    hero_wins = r.random() < 0.5
    s.opening()
    s.visit_place(f"{h.name} and {f.name}")
    s.say(f, f"Let's have a race {goal}!")
    s.say(h, "Ready, steady, go!", "shouted")
    s.add(f"{f.name} ran very fast at first, but then {f.he} stopped to look at {s.pick(s.features)}.")
    s.add(f"{h.name} kept going, step by step.")
    if hero_wins:
        s.add(f"{h.name} got {goal} first!", f"{s.feel(h, 'excited')}.")
        s.say(f, f"Well done, {h.name}! You did not stop once.")
    else:
        s.add(f"{f.name} ran again and just beat {h.name} {goal}.", f"{h.name} was a little sad, but then {h.he} smiled.")
        s.say(h, f"Well done, {f.name}! That was fun.")
    s.say(e, "You both ran very well.")
    s.add(f"Then they sat down and shared {a_an(s.pick(L.FOODS))}.")
    s.ending("race")


def plot_explore(s: Story) -> None:
    h, f, e = s.hero, s.friend, s.elder
    find = s.pick(L.EXPLORE_FINDS)
    s.opening()
    s.add(f"{h.name} loved to explore.")
    s.visit_place(f"{h.name} and {f.name}")
    s.add(f"They {s.pick(s.activities)}.", f"Near {s.pick(s.features)}, {h.name} found {find}.")
    s.say(h, f"Look, {f.name}! What is it?", "whispered")
    s.say(f, s.pick(["I have never seen anything like it!", "Maybe it is magic!", "Let's show it to someone who knows."]))
    s.para()
    s.add(f"They took the {find.split(' ', 1)[1]} home to {e.name}.")
    s.say(e, s.pick(["What a wonderful discovery!", "You found a real treasure.", "Let's find out more about it."]))
    s.add(f"{e.name} found a book about it, and they read it together.")
    s.add(f"{h.name} put the treasure on a shelf next to {h.his} {s.obj}.")
    s.ending("explore")


PLOTS: list[Callable[[Story], None]] = [
    plot_lost, plot_broken, plot_stuck, plot_fear, plot_share,
    plot_animal, plot_bake, plot_weather, plot_race, plot_explore,
]


def story(seed: int, index: int) -> str:
    """Story `index` of the corpus for `seed` (independent of every other story)."""
    rng = random.Random(f"rrtrain-stories:{seed}:{index}")
    s = Story(rng)
    rng.choice(PLOTS)(s)
    return s.text()


@dataclass(frozen=True)
class StoryCorpus:
    """`num_docs` stories for `seed`; iterable many times with the same result."""

    num_docs: int
    seed: int = 0

    def __iter__(self) -> Iterator[str]:
        for i in range(self.num_docs):
            yield story(self.seed, i)
