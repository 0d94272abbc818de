"""Pinned reference samples of the synthetic generators: the held-out splits the embedded model is scored on and the
train stream it was trained on must not change unnoticed (a change to a generator, to the split hashing or to the
seeding shows here, also across processes: the digests were computed in another process).

After a deliberate change to a generator, re-derive the digests with :func:`digest` and say so in the commit: the
shipped model's reported accuracies and the README table were measured on the old splits."""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest

from specfold.eval.tasks.synthetic import TASKS, iter_train, load_split

TRAIN_PINNED = 200  # first samples of each task's train stream


def digest(samples) -> str:
    """sha256 over ``[sample_id, prompt, reference, meta]`` of every sample, one JSON line each."""
    h = hashlib.sha256()
    for s in samples:
        h.update(json.dumps([s.sample_id, s.prompt, s.reference, s.meta], sort_keys=True).encode() + b"\n")
    return h.hexdigest()


DIGESTS = {
    ("synth-math", "test"): "1f1c1d1bfa610cf0313dfabaf85986918fa200e2a293f7f304dbcb4ea6db93b7",
    ("synth-math", "calib"): "9f813435eb9d23e1db3722f5995b7e354859daa0abfeba735afc44c23395bfbc",
    ("synth-math", "train"): "a069495ff7c5b823fa084cb0405858ac66fabdca9a36efa68d09aff833fb58fd",
    ("synth-code", "test"): "1da2a0608b5d5fce9b7e23969bc02c84307e7f4b65a008f9631ee73d6bea599e",
    ("synth-code", "calib"): "dcd654df81fff5e0b2421e054214a9e758c0114c7d71d02480e5f39f2d81bce4",
    ("synth-code", "train"): "feef3e1b81718c7001a2482845033cf9693752c6f61d2863d9b4e44d0a84c7f1",
    ("synth-if", "test"): "c5a75d4e40042f74523fa6ccca4dc6a09a62825961f506359796e48a91acee55",
    ("synth-if", "calib"): "2e00dbb064b52c72c009137d07c8de6f1189f15012ad6d8c1511bb91c3db8399",
    ("synth-if", "train"): "9cc2fe4c7fb5a347ce69ee6f66b8d68365609a61025ba83d54666b765da4360d",
}
MIXED_TRAIN = "50130265d853fef89d7d7dee31ba5fc8b41285ca46286fdd357412052eb49a61"  # iter_train(), first 300

# The first test sample of each task, literally (readable when a digest breaks).
FIRST_TEST = {
    "synth-math": ("Rosa has 4 packs with 2 apples in each. She sells 7 apples. How many apples does Rosa have at "
                   "the end?", "4*2=8\n8-7=1\nAnswer: 1"),
    "synth-code": ("Write a function calc(num) that returns num plus 19.", "def calc(num):\n    return num + 19"),
    "synth-if": ("Write exactly 4 metals on one line, separated by spaces.", "Iron Gold Silver Copper"),
}


@pytest.mark.parametrize("task", TASKS)
def test_first_test_sample_is_pinned(task):
    s = load_split(task, "test", limit=1)[0]
    assert (s.sample_id, s.prompt, s.reference) == (f"{task}/test/00000", *FIRST_TEST[task])


@pytest.mark.parametrize("split", ["test", "calib", "train"])
@pytest.mark.parametrize("task", TASKS)
def test_split_digest_is_pinned(task, split):
    samples = load_split(task, split, limit=TRAIN_PINNED if split == "train" else None)
    assert digest(samples) == DIGESTS[task, split]


def test_interleaved_train_stream_is_pinned():
    assert digest(itertools.islice(iter_train(), 300)) == MIXED_TRAIN
