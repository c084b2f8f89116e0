"""`find_any` against the one-needle-at-a-time reference (`needle in data`): random bytes with needles
planted anywhere, across chunk boundaries, shorter and longer than the 8-byte window, sharing tails."""
from __future__ import annotations

import random

import pytest

from pipeline_src.methods import byte_search
from pipeline_src.methods.byte_search import find_any


def reference(data: bytes, needles) -> set[bytes]:
    return {x for x in needles if x in data}


@pytest.mark.parametrize("seed", range(40))
def test_it_finds_what_the_reference_finds(seed, monkeypatch):
    rng = random.Random(seed)
    monkeypatch.setattr(byte_search, "CHUNK", rng.choice([16, 64, 1000]))  # many chunk boundaries
    alphabet = bytes(rng.sample(range(256), rng.choice([2, 4, 256])))  # few letters: chance matches too
    data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 3000)))
    needles = {bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 30))) for _ in range(rng.randrange(1, 20))}
    needles |= {b"digits/0001.png", b"digits/0002.png", b"x" * 40 + b"/long.png", b"ab"}  # shared tails, long, short
    if data and rng.random() < 0.7:
        x = rng.choice(sorted(needles))
        at = rng.randrange(len(data) + 1)
        data = data[:at] + x + data[at:]
    found, want = find_any(data, needles), reference(data, needles)
    assert (found is None and not want) or found in want, (found, want)


def test_nothing_is_found_in_nothing_and_an_empty_needle_is_refused():
    assert find_any(b"", [b"a"]) is None
    assert find_any(b"abc", []) is None
    with pytest.raises(ValueError, match="empty needle"):
        find_any(b"abc", [b""])
