"""Generators the training data holds for itself (a dataset's ``self.rng``, a sampler's
``generator``) are checkpointed with the run and put back at a resume: bitwise identical to
an uninterrupted run, mid-epoch, at an epoch's end, and past a ``max_steps`` budget."""

from __future__ import annotations

import io
import random
import shutil

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

import somatize.torch as st
from somatize.torch.held_rng import find_held, held_generators, held_states, put_held
from somatize.torch.integrity import write_checkpoint
from tests.torch.test_checkpoint_resume import Crash, CrashAt, graph


class Noisy(Dataset):
    """Each read augmented from a generator the dataset holds (``draw(gen, n)``)."""

    def __init__(self, gen, draw) -> None:
        base = torch.Generator().manual_seed(0)
        self.x = torch.randn(40, 4, generator=base)
        self.y = torch.randint(0, 3, (40,), generator=base)
        self.aug = {"rng": gen}
        self.draw = draw

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        noise = torch.as_tensor(np.asarray(self.draw(self.aug["rng"]), dtype="float32"))
        return self.x[i] + 0.1 * noise, self.y[i]


def _three_gaussians_and_one(gen):  # (leaves numpy's legacy / Python's gaussian half held)
    return [gen.standard_normal(), gen.standard_normal(), gen.standard_normal(), gen.random()]


def _python(gen):
    return [gen.gauss(0, 1), gen.gauss(0, 1), gen.gauss(0, 1), gen.random()]


def _torch(gen):
    return torch.randn(4, generator=gen).tolist()


LOADERS = {
    "numpy default_rng": lambda: Noisy(np.random.default_rng(0), lambda g: g.standard_normal(4)),
    "numpy Philox": lambda: Noisy(
        np.random.Generator(np.random.Philox(0)), _three_gaussians_and_one
    ),
    "numpy RandomState": lambda: Noisy(np.random.RandomState(0), _three_gaussians_and_one),
    "numpy MT19937 bit generator": lambda: Noisy(
        np.random.MT19937(0), lambda g: np.random.Generator(g).standard_normal(4)
    ),
    "random.Random": lambda: Noisy(random.Random(0), _python),
    "torch.Generator": lambda: Noisy(torch.Generator().manual_seed(0), _torch),
}


def loader(name: str) -> DataLoader:
    if name == "sampler.generator":  # a sampler drawing from its own generator
        sampler = WeightedRandomSampler(
            torch.rand(40, generator=torch.Generator().manual_seed(2)) + 0.1,
            40,
            generator=torch.Generator().manual_seed(1),
        )
        return DataLoader(LOADERS["torch.Generator"](), batch_size=6, sampler=sampler)
    return DataLoader(LOADERS[name](), batch_size=6)


def trainer(path, watchers=(), max_steps=None) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=2e-2),
        epochs=3,
        max_steps=max_steps,
        checkpoint=st.Checkpointing(path, every_steps=3, keep=2),
        watchers=watchers,
        seed=5,
        options=st.Options(progress=False),
    )


def same(a: st.TrainResult, b: st.TrainResult) -> None:
    assert a.losses == b.losses
    for name, value in a.state.items():
        assert torch.equal(value, b.state[name]), name


NAMES = [*sorted(LOADERS), "sampler.generator"]


@pytest.mark.parametrize("name", NAMES)
def test_a_resumed_run_draws_from_the_datas_own_generators_where_the_run_left_them(tmp_path, name):
    """Each fit builds its data afresh (as a new process would): before, a resume drew from
    the generators as they were made, and its losses differed from the crash on."""
    reference = trainer(tmp_path / "ref").fit(graph(0), loader(name))
    assert len(reference.losses) == 21
    # 7 batches an epoch, a checkpoint every 3 steps and at each epoch's end: a crash at
    # step 11 resumes from step 9 (mid-epoch, 2 batches replayed), at 15 from step 14
    for crash in (11, 15):
        with pytest.raises(Crash):
            trainer(tmp_path / "a", [CrashAt(crash)]).fit(graph(0), loader(name))
        resumed = trainer(tmp_path / "a").fit(graph(0), loader(name), resume="last")
        same(resumed, reference)
        shutil.rmtree(tmp_path / "a")
    # a budget spent mid-epoch, then extended: the batch read past the budget is read again
    trainer(tmp_path / "b", max_steps=10).fit(graph(0), loader(name))
    same(trainer(tmp_path / "b").fit(graph(0), loader(name), resume="last"), reference)


def test_a_checkpoint_without_the_datas_generators_warns_at_the_resume(tmp_path):
    """A checkpoint written before they were kept (or with other data): the resume cannot
    put them back and says so, naming the generator."""
    with pytest.raises(Crash):
        trainer(tmp_path, [CrashAt(11)]).fit(graph(0), loader("numpy default_rng"))
    last = tmp_path / "step-000000009.ckpt"
    payload = st.load_checkpoint(last)
    for key in ("held_rng", "epoch_held_rng"):
        del payload[key]
    write_checkpoint(last, payload)
    with pytest.warns(UserWarning, match=r"random generators \(dataset.aug\['rng'\]\) the"):
        trainer(tmp_path).fit(graph(0), loader("numpy default_rng"), resume=last)


def test_a_generator_whose_state_cannot_be_read_is_warned_of(tmp_path):
    """``random.SystemRandom`` draws from the operating system: no checkpoint holds it."""
    data = DataLoader(Noisy(random.SystemRandom(), _python), batch_size=6)
    with pytest.warns(UserWarning, match=r"cannot be read \(dataset.aug\['rng'\]"):
        trainer(tmp_path, max_steps=2).fit(graph(0), data)


def reads(data: DataLoader) -> list[torch.Tensor]:
    """What drawing from the data's own generators gives: items read, a sampler's draw."""
    return [data.dataset[0][0] for _ in range(3)] + [torch.tensor(list(iter(data.sampler)))]


@pytest.mark.parametrize("name", NAMES)
def test_states_survive_a_weights_only_round_trip_and_are_put_back_exactly(name):
    data = loader(name)
    held = find_held(data)
    buffer = io.BytesIO()
    torch.save(held_states(held), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    first = reads(data)
    assert put_held(held, saved) == []
    again = reads(data)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(reads(data)[0], first[0])  # (the draws do move them on)


def test_held_generators_names_the_datasets_and_the_samplers_own():
    from tests.torch.test_resume_random_data import Augmented

    assert held_generators(loader("numpy default_rng")) == ["dataset.aug['rng']"]
    # workers get a fresh copy of the dataset every epoch: its draws repeat, resume or not
    workers = DataLoader(LOADERS["numpy default_rng"](), batch_size=6, num_workers=1)
    assert held_generators(workers) == []
    assert held_generators(loader("sampler.generator")) == [
        "dataset.aug['rng']",
        "sampler.generator",
    ]
    # the Trainer seeds a RandomSampler's generator itself, each epoch; global draws are held
    shuffled = DataLoader(Augmented(), batch_size=6, shuffle=True)
    shuffled.sampler.generator = torch.Generator()
    assert held_generators(shuffled) == []
    assert held_generators([(torch.zeros(2, 4), torch.zeros(2))]) == []
