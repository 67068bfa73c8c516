"""``called``: how a worker's failed or lost call is named — its plain arguments shown, no
``__repr__`` of the user's run."""

from __future__ import annotations

from dataclasses import dataclass, field

from somatize.remote_errors import called


@dataclass
class Config:
    lr: float
    seed: int
    tags: list[str] = field(default_factory=list)
    secret: str = field(default="x", repr=False)


class Loud:
    def __repr__(self) -> str:
        raise AssertionError("a user's __repr__ was run")


def train(*args, **kwargs):
    return args, kwargs


def test_plain_arguments_and_dataclasses_are_shown_others_by_type() -> None:
    text = called(train, (Config(0.1, 3, ["a"]), Loud()), {"epochs": 2, "name": "run"})
    assert text == "train(Config(lr=0.1, seed=3, tags=['a']), <Loud>, epochs=2, name='run')"


def test_long_or_deep_values_are_cut() -> None:
    assert called(train, ("x" * 100,), {}) == f"train('{'x' * 37}...')"
    assert called(train, ([[[1]]],), {}) == "train([[<list>]])"
    assert called(train, (list(range(20)),), {}) == "train(<list>)"
    assert called(train, tuple(range(9)), {}).endswith("4, 5, ...)")
    assert called(lambda: 0, (), {}) == "test_long_or_deep_values_are_cut.<locals>.<lambda>()"
