"""A two-tower model whose image input changes every epoch (augmentation) and whose frozen
text tower is remembered per example: with ``Pick`` the tower sees its texts alone, so it
hits; reading ``inputs[1]`` itself, it is keyed by the images too and misses every row."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Pick

N, EPOCHS = 48, 3


class Tower(Node):
    def __init__(self, width: int, part: int | None = None):
        self.part = part  # None: its input is its own (after a Pick)
        self.lin = nn.Linear(width, 4)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x if self.part is None else x[self.part])))


class Score(Node):
    def forward(self, towers, ctx):
        image, text = towers
        return Done(Opaque(torch.stack([(image * text).sum(-1), -(image * text).sum(-1)], -1)))


class Augmented(Dataset):
    """Images jittered afresh at every read; texts as they are."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.images, self.texts = torch.randn(N, 6, generator=gen), torch.randn(N, 3, generator=gen)
        self.labels = torch.randint(0, 2, (N,), generator=gen)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return (self.images[i] + 0.01 * torch.randn(6), self.texts[i]), self.labels[i]


def graph(picked: bool) -> Graph:
    torch.manual_seed(1)
    if picked:
        towers = (Pick(0) >> Tower(6).with_id("img")) | (Pick(1) >> Tower(3).with_id("txt"))
    else:
        towers = Tower(6, part=0).with_id("img") | Tower(3, part=1).with_id("txt")
    return Graph.somatize(towers >> Score()).freeze("txt").cache("txt", per="example")


def fit(g: Graph) -> st.TrainResult:
    torch.manual_seed(2)
    loader = DataLoader(Augmented(), batch_size=16, shuffle=True)
    trainer = st.Trainer(loss=F.cross_entropy, epochs=EPOCHS, options=st.Options(progress=False),
                         optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))  # fmt: skip
    return trainer.fit(g, loader)


def test_a_picked_tower_hits_where_a_tower_reading_every_input_misses():
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        whole = fit(graph(picked=False))
    assert whole.cache == {"txt": {"hits": 0, "misses": EPOCHS * N}}  # an image in every row
    assert any("Pick(1)" in str(w.message) for w in said)  # the cold-cache warning says how
    picked = fit(graph(picked=True))
    assert picked.cache == {"txt": {"hits": (EPOCHS - 1) * N, "misses": N}}
    # the same model either way: a hit gives what the tower computes
    for k, v in whole.state.items():
        assert torch.allclose(v, picked.state[k], atol=1e-6), k


def test_picked_towers_match_plain_torch_in_outputs_and_gradients():
    g = graph(picked=True)
    model = st.module(g)
    img_lin, txt_lin = g["img"].lin, g["txt"].lin
    image = torch.randn(5, 6, requires_grad=True)  # input gradients: passed Opaque by module(g)
    text = torch.randn(5, 3)
    for _ in range(2):  # the second call: the text tower's rows are hits
        out = model(image, text)
        a, b = img_lin(image), txt_lin(text).detach()
        want = torch.stack([(a * b).sum(-1), -(a * b).sum(-1)], -1)
        assert torch.allclose(out, want, atol=1e-6)
        (g_out,) = torch.autograd.grad(out.square().sum(), image)
        (g_want,) = torch.autograd.grad(want.square().sum(), image)
        assert torch.allclose(g_out, g_want, atol=1e-6) and g_out.abs().sum() > 0


def test_a_dict_batch_is_picked_by_key():
    torch.manual_seed(0)
    towers = (Pick("image") >> Tower(6).with_id("img")) | (Pick("text") >> Tower(3).with_id("txt"))
    g = Graph.somatize(towers >> Score())
    batch = {"image": torch.randn(5, 6), "text": torch.randn(5, 3)}
    out = st.module(g)(batch)
    a, b = g["img"].lin(batch["image"]), g["txt"].lin(batch["text"])
    assert torch.allclose(out[:, 0], (a * b).sum(-1), atol=1e-6)


def test_the_hint_is_for_towers_not_for_a_lone_backbone():
    import warnings

    class Two(Node):
        def __init__(self):
            self.lin = nn.Linear(4, 2)

        def forward(self, h, ctx):
            return Done(Opaque(self.lin(h)))

    torch.manual_seed(1)
    g = Graph.somatize(Tower(6, part=0).with_id("img") >> Two())
    g.freeze("img").cache("img", per="example")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert fit(g).cache["img"]["hits"] == 0  # its own input is augmented: no remedy
    cold = [str(w.message) for w in said if "is cached, but none of its" in str(w.message)]
    assert len(cold) == 1 and "Pick(" not in cold[0]


def test_a_flat_processor_batch_gives_the_text_tower_its_two_keys():
    # CLIP-style processors give one flat dict: pixel_values, input_ids, attention_mask
    from somatize import Recorder
    from somatize.watchers import CacheRows

    class Text(Node):
        def __init__(self):
            self.emb = nn.Embedding(50, 4)

        def forward(self, x, ctx):
            mask = x["attention_mask"].unsqueeze(-1).float()
            return Done(Opaque((self.emb(x["input_ids"]) * mask).sum(1) / mask.sum(1)))

    torch.manual_seed(0)
    rec = Recorder()
    pair = (Pick("pixel_values") >> Tower(6).with_id("img")) | (
        Pick("input_ids", "attention_mask") >> Text().with_id("txt")
    )
    g = Graph.somatize(pair >> Score(), watchers=[rec]).freeze("txt").cache("txt", per="example")
    ids, mask = torch.randint(0, 50, (8, 5)), torch.ones(8, 5, dtype=torch.long)
    model = st.module(g)
    for _ in range(3):  # new pixels every call, the same texts
        model({"pixel_values": torch.randn(8, 6), "input_ids": ids, "attention_mask": mask})
    rows = rec.of(CacheRows)
    assert [(e.hits, e.misses) for e in rows] == [(0, 8), (8, 0), (8, 0)]


def test_a_tower_cached_whole_beside_an_input_that_requires_grad_matches_plain_torch():
    # the image requires grad (its input gradients wanted): the text tower cached per batch
    # after Pick(1) was refused, the whole input being Opaque; it is keyed by its texts
    from somatize import Recorder
    from somatize.watchers import CacheHit

    torch.manual_seed(1)
    towers = (Pick(0) >> Tower(6).with_id("img")) | (Pick(1) >> Tower(3).with_id("txt"))
    rec = Recorder()
    g = Graph.somatize(towers >> Score(), watchers=[rec]).freeze("txt").cache("txt")
    model, (img_lin, txt_lin) = st.module(g), (g["img"].lin, g["txt"].lin)
    text = torch.randn(5, 3)
    for _ in range(2):
        image = torch.randn(5, 6, requires_grad=True)
        out = model(image, text)
        a, b = img_lin(image), txt_lin(text).detach()
        want = torch.stack([(a * b).sum(-1), -(a * b).sum(-1)], -1)
        assert torch.allclose(out, want, atol=1e-6)
        (g_out,) = torch.autograd.grad(out.square().sum(), image)
        (g_want,) = torch.autograd.grad(want.square().sum(), image)
        assert torch.allclose(g_out, g_want, atol=1e-6) and g_out.abs().sum() > 0
    assert [e.node for e in rec.of(CacheHit)] == ["txt"]
