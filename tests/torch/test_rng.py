"""``rng.snapshot`` / ``put_back``: every global generator comes back exactly as it was —
numpy's legacy state with the gaussian it holds (the second of a pair, which draws no word
when returned), Python's with its own — however far the generators moved meanwhile. And generators the data holds for itself (a
dataset's ``np.random.default_rng``, a sampler's ``generator``), which no checkpoint holds:
``held_generators`` names them, and a checkpointed fit warns of them."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest
import torch

from somatize.torch.rng import put_back, snapshot


def draws() -> tuple[float, ...]:
    return (
        float(np.random.standard_normal()),  # the gaussian held from the pair drawn before
        float(np.random.standard_normal()),
        float(np.random.rand()),
        random.gauss(0, 1),
        random.random(),
        torch.rand(()).item(),
    )


def test_put_back_restores_every_generator_with_the_gaussians_they_hold():
    np.random.seed(3)
    np.random.standard_normal()  # draws a pair, returns one, holds the other
    random.seed(3)
    random.gauss(0, 1)  # (Python's gauss holds the second of its pair too)
    torch.manual_seed(3)
    held = np.random.get_state(legacy=True)
    assert held[3] == 1  # (has_gauss: what the test is about)
    kept = snapshot()
    expected = draws()
    for _ in range(2):  # (a snapshot is put back as often as asked, unchanged by it)
        np.random.seed(5)
        random.seed(5)
        torch.manual_seed(5)
        draws()
        put_back(kept)
        now = np.random.get_state(legacy=True)
        assert now[0] == held[0] and np.array_equal(now[1], held[1])
        assert now[2:] == held[2:]
        assert draws() == expected


class HeldRng(torch.utils.data.Dataset):
    """Augmentation drawn from a generator the dataset holds (numpy's modern style)."""

    def __init__(self) -> None:
        self.x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
        self.y = torch.arange(40) % 3
        self.aug = {"rng": np.random.default_rng(0)}

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        noise = torch.from_numpy(self.aug["rng"].standard_normal(4)).float()
        return self.x[i] + 0.1 * noise, self.y[i]


def weighted_with_generator(dataset):
    sampler = torch.utils.data.WeightedRandomSampler(
        torch.ones(40), 40, generator=torch.Generator().manual_seed(1)
    )
    return torch.utils.data.DataLoader(dataset, batch_size=6, sampler=sampler)


def test_held_generators_names_the_datasets_and_the_samplers_own():
    from torch.utils.data import DataLoader

    from somatize.torch.rng import held_generators
    from tests.torch.test_resume_random_data import Augmented

    assert held_generators(DataLoader(HeldRng(), batch_size=6)) == ["dataset.aug['rng']"]
    # workers get a fresh copy of the dataset every epoch: its draws repeat, resume or not
    assert held_generators(DataLoader(HeldRng(), batch_size=6, num_workers=1)) == []
    assert held_generators(weighted_with_generator(Augmented())) == ["sampler.generator"]
    # the Trainer seeds a RandomSampler's generator itself, each epoch; global draws are held
    shuffled = DataLoader(Augmented(), batch_size=6, shuffle=True)
    shuffled.sampler.generator = torch.Generator()
    assert held_generators(shuffled) == []
    assert held_generators([(torch.zeros(2, 4), torch.zeros(2))]) == []


def test_a_checkpointed_fit_warns_of_generators_its_data_holds_and_the_resume_differs(tmp_path):
    """Without the warning this resume was silently not bitwise identical."""
    from tests.torch.test_checkpoint_resume import Crash, CrashAt, graph
    from tests.torch.test_resume_random_data import Augmented, trainer

    for make in (
        lambda: torch.utils.data.DataLoader(HeldRng(), batch_size=6),
        lambda: weighted_with_generator(Augmented()),
    ):
        with pytest.warns(UserWarning, match=r"generators of its own \((dataset|sampler)"):
            reference = trainer(tmp_path / "ref").fit(graph(0), make())
        with pytest.raises(Crash), pytest.warns(UserWarning, match="a run resumed from"):
            trainer(tmp_path / "a", watchers=[CrashAt(11)]).fit(graph(0), make())
        with pytest.warns(UserWarning, match="this resumed run draws from them"):
            resumed = trainer(tmp_path / "a").fit(graph(0), make(), resume="last")
        assert resumed.losses[:9] == reference.losses[:9]
        assert resumed.losses[9:] != reference.losses[9:]  # what the warning says
        for d in ("ref", "a"):
            shutil.rmtree(tmp_path / d)
