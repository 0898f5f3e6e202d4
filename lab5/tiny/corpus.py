"""Short made-up stories from a small grammar: the text the embedded tiny LLaMA is trained on.

Everything here is written for this repository; nothing is copied from a data set. A story is 3 to 6
sentences about one named character (who comes back by name and as he/she), an animal friend, a few
places and things, tied together with "Then", "Later", "After that" and "At the end of the day".
The output depends only on (n_stories, seed), so every clone trains the same model on the same text.

    corpus(n_stories, seed) -> str   stories separated by a blank line
    vocabulary() -> frozenset[str]   every word the grammar can emit, lower case
    words(text) -> list[str]         the words of a text, lower case, as vocabulary() spells them
"""

from __future__ import annotations

import random
import re

__all__ = ["STORY_SEPARATOR", "corpus", "story", "vocabulary", "words"]

STORY_SEPARATOR = "\n\n"

# (name, pronoun, possessive): the pronoun keeps a character's later sentences consistent with the first
CHARACTERS: tuple[tuple[str, str, str], ...] = tuple(
    [(n, "she", "her") for n in ("Lily", "Mia", "Anna", "Sara", "Emma", "Lucy", "Nora", "Ella", "Ruby", "Zoe")]
    + [(n, "he", "his") for n in ("Tom", "Ben", "Max", "Leo", "Sam", "Jack", "Tim", "Finn", "Owen", "Noah")]
)
ANIMALS = (
    "dog", "cat", "bird", "fox", "rabbit", "duck", "frog", "bear", "mouse", "owl",
    "horse", "goat", "sheep", "pig", "cow", "turtle", "squirrel", "lamb", "puppy", "kitten",
)  # fmt: skip
PLACES = (
    "park", "garden", "forest", "beach", "farm", "river", "lake", "hill", "village", "school",
    "kitchen", "barn", "market", "meadow", "field", "pond", "house", "yard", "library", "zoo",
)  # fmt: skip
THINGS = (
    "ball", "kite", "box", "book", "hat", "cake", "apple", "flower", "stone", "shell",
    "boat", "drum", "cup", "basket", "key", "map", "coat", "toy", "bell", "sock",
)  # fmt: skip
ADJECTIVES = (
    "big", "small", "red", "blue", "green", "yellow", "old", "new", "shiny", "soft",
    "little", "happy", "pretty", "funny", "round", "warm", "bright", "tiny", "brown", "white",
)  # fmt: skip
FEELINGS = ("happy", "sad", "tired", "hungry", "scared", "proud", "excited", "calm", "sleepy", "glad")
FRIENDLY = ("kind", "brave", "clever", "gentle", "curious", "cheerful", "shy", "quiet", "busy", "silly")
WEATHER = ("sunny", "rainy", "windy", "cold", "warm", "bright", "cloudy", "snowy")
TIMES = ("morning", "afternoon", "evening")
# (past tense, object word): what a character did with a thing
THING_VERBS = ("found", "lost", "wanted", "saw", "made", "painted", "carried", "dropped", "shared", "hid")
MOVES = ("walked", "ran", "went", "hopped", "skipped", "raced")
ANIMAL_ACTS = ("barked", "jumped", "sang", "danced", "slept", "laughed", "played", "smiled", "waited", "looked around")
CONNECTORS = ("Then", "Later", "After that", "Soon", "Next")
ENDINGS = (
    "At the end of the day, {name} went home and slept well.",
    "At the end of the day, {name} was {feeling} and smiled.",
    "At the end of the day, {name} and the {animal} were best friends.",
    "In the end, {name} said thank you to the {animal}.",
    "That night, {name} dreamed about the {place}.",
)


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


class _Story:
    """The cast and props of one story, fixed up front so later sentences refer back to them."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.name, self.he, self.his = rng.choice(CHARACTERS)
        self.friend = rng.choice([c for c in CHARACTERS if c[0] != self.name])[0]
        self.animal = rng.choice(ANIMALS)
        self.place, self.place2 = rng.sample(PLACES, 2)
        self.thing = rng.choice(THINGS)
        self.adj = rng.choice(ADJECTIVES)
        self.weather = rng.choice(WEATHER)  # one day's weather: "One rainy morning ... it was sunny" is nonsense

    def fill(self, template: str) -> str:
        r = self.rng
        return template.format(
            name=self.name,
            he=self.he,
            He=self.he.capitalize(),
            his=self.his,
            friend=self.friend,
            animal=self.animal,
            place=self.place,
            place2=self.place2,
            thing=self.thing,
            adj=self.adj,
            a_adj=_a(self.adj),
            feeling=r.choice(FEELINGS),
            trait=r.choice(FRIENDLY),
            a_trait=_a(r.choice(FRIENDLY)),
            weather=self.weather,
            time=r.choice(TIMES),
            verb=r.choice(THING_VERBS),
            move=r.choice(MOVES),
            act=r.choice(ANIMAL_ACTS),
        )


# Each opening introduces the character; the middle sentences use {he}/{name} and the same props.
OPENINGS = (
    "Once upon a time, there was {a_trait} girl named {name}.",
    "Once upon a time, there was {a_trait} boy named {name}.",
    "Once upon a time, {name} lived near the {place}.",
    "One {weather} {time}, {name} went to the {place}.",
    "{name} was {a_trait} child who loved the {place}.",
    "One day, {name} saw {a_adj} {thing} in the {place}.",
)
MEETING = "{He} met a {trait} {animal} by the {place}."
MIDDLES = (
    MEETING,
    "{He} {verb} {a_adj} {thing} near the {place}.",
    "{name} and the {animal} {move} to the {place2}.",
    "The {animal} {act} and {name} laughed.",
    "{He} felt {feeling} because the {thing} was {adj}.",
    "{name} showed the {thing} to {his} friend {friend}.",
    "{friend} said the {thing} was very {adj}.",
    "The {animal} wanted to play with the {thing}.",
    "{He} {move} home with {his} {thing}.",
    "It was {weather}, so {name} stayed in the {place2}.",
    "{name} and {friend} played with the {animal} all {time}.",
    "{He} gave the {animal} {a_adj} {thing}.",
)


def _gendered_opening(s: _Story, template: str) -> bool:
    # "girl named Tom" would teach the model nonsense: skip an opening that contradicts the pronoun
    return not (("girl" in template and s.he != "she") or ("boy" in template and s.he != "he"))


def story(rng: random.Random) -> str:
    """One story of 3 to 6 sentences, drawn from rng."""
    s = _Story(rng)
    opening = rng.choice([t for t in OPENINGS if _gendered_opening(s, t)])
    n_middle = rng.randint(1, 4)
    middle = rng.sample(MIDDLES, n_middle)
    # the animal is met before anything else is said about it, so "the {animal}" always refers back;
    # the cut keeps the story at n_middle middle sentences when the meeting was not among those drawn
    if any("{animal}" in t for t in middle):
        middle = [MEETING, *(t for t in middle if t != MEETING)][:n_middle]
    sentences = [s.fill(opening)]
    for i, template in enumerate(middle):
        text = s.fill(template)
        if i > 0 and rng.random() < 0.6:  # a connector ties a sentence to the one before it
            text = f"{rng.choice(CONNECTORS)}, {text[0].lower() + text[1:] if _starts_lower(text) else text}"
        sentences.append(text)
    # an ending that thanks "the {animal}" only makes sense once the animal has been met
    endings = ENDINGS if MEETING in middle else [t for t in ENDINGS if "{animal}" not in t]
    sentences.append(s.fill(rng.choice(endings)))
    return " ".join(sentences)


def _starts_lower(text: str) -> bool:
    # after "Then," a pronoun or "The" goes lower case, a name keeps its capital
    first = text.split(" ", 1)[0]
    return first in ("He", "She", "The", "It")


def corpus(n_stories: int, seed: int = 0) -> str:
    """n_stories stories from one seeded generator, separated by blank lines; the same text every call."""
    if n_stories < 0:
        raise ValueError(f"n_stories must be >= 0, got {n_stories}")
    rng = random.Random(seed)
    return STORY_SEPARATOR.join(story(rng) for _ in range(n_stories))


_WORD = re.compile(r"[A-Za-z]+")


def words(text: str) -> list[str]:
    """The words of text in lower case (punctuation dropped), for comparing with vocabulary()."""
    return [w.lower() for w in _WORD.findall(text)]


def vocabulary() -> frozenset[str]:
    """Every word the grammar can produce, in lower case: the word lists plus the templates' own words."""
    lists: list[tuple[str, ...]] = [
        tuple(c[0] for c in CHARACTERS),
        ("he", "she", "his", "her"),
        ANIMALS,
        PLACES,
        THINGS,
        ADJECTIVES,
        FEELINGS,
        FRIENDLY,
        WEATHER,
        TIMES,
        THING_VERBS,
        MOVES,
        ANIMAL_ACTS,
        CONNECTORS,
        ENDINGS,
        OPENINGS,
        MIDDLES,
        ("a", "an"),
    ]
    placeholders = re.compile(r"\{[^}]*\}")
    found: set[str] = set()
    for group in lists:
        for entry in group:
            found.update(words(placeholders.sub(" ", entry)))
    return frozenset(found)
