"""What a node cached per example (or whole) is told when its batch or output is not one
per-example memory can keep: the error names the node, what is wrong and the fix."""

from __future__ import annotations

import re
import warnings
from collections import OrderedDict, namedtuple

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import CacheError, Done, Graph, Node, Opaque, ValueConversionError

Features = namedtuple("Features", "pooled tokens")


class Returns(Node):
    """A frozen backbone returning its features in the container ``kind`` names."""

    def __init__(self, kind: str):
        self.kind = kind
        self.lin = nn.Linear(2, 2)

    def forward(self, x, ctx):
        h = self.lin(x)
        if self.kind == "namedtuple":
            return Done(Opaque(Features(h, h)))
        if self.kind == "ordereddict":  # a HuggingFace ModelOutput is one
            return Done(Opaque(OrderedDict(pooled=h)))
        return Done(Opaque(h))


def frozen(kind: str, per: str) -> Graph:
    g = Graph.somatize(Returns(kind).with_id("enc"))
    g.freeze("enc").cache("enc", per=per)
    st.module(g)
    return g


@pytest.mark.parametrize("per", ["example", "batch"])
@pytest.mark.parametrize(
    ("kind", "fix"), [("namedtuple", r"tuple\(\.\.\.\)"), ("ordereddict", r"dict\(\.\.\.\)")]
)
def test_a_detached_output_in_a_subclass_is_named_as_such_not_as_needing_grad(kind, fix, per):
    g = frozen(kind, per)
    with pytest.raises(CacheError) as e:
        g.forward(torch.randn(3, 2))
    message = str(e.value)
    assert "'enc'" in message and "subclass of" in message and "stop caching" in message
    assert re.search(fix, message)
    assert "requires grad" not in message and "detach" not in message


@pytest.mark.parametrize("per", ["example", "batch"])
def test_an_output_that_requires_grad_is_still_told_to_detach(per):
    class Leaks(Node):
        def forward(self, x, ctx):
            return Done(Opaque(x.clone().requires_grad_()))  # a leaf of its own

    g = Graph.somatize(Leaks().with_id("enc"))
    g.freeze("enc").cache("enc", per=per)
    st.module(g)
    with pytest.raises(CacheError, match=r"'enc'.*requires grad.*\.detach\(\)"):
        g.forward(torch.randn(3, 2))


def test_a_batch_dict_with_keys_that_are_not_str_says_so():
    class Both(Node):
        rowwise = True

        def forward(self, x, ctx):
            return Done(x[0] + x[1])

    g = Graph().node("enc", Both()).cache("enc", per="example")
    st.module(g)
    with pytest.raises(CacheError, match=r"'enc'.*a dict whose key 0 is an int.*str keys"):
        g.forward({0: torch.ones(3, 2), 1: torch.ones(3, 2)})


class Stepped(Node):
    """Row-wise, but its output depends on the step: what ctx carries enters no key."""

    rowwise = True

    def forward(self, x, ctx):
        return Done(x * ctx.step)


def test_a_node_cached_per_example_that_reads_ctx_warns_as_one_cached_whole_does():
    g = Graph.somatize(Stepped().with_id("enc"))
    g.cache("enc", per="example")
    st.module(g)
    with pytest.warns(UserWarning, match=r"node 'enc' \(.*Stepped\) is cached .*ctx\.step"):
        g.run(torch.ones(2, 3), step=1)


class Counting(Node):
    """Row-wise, but counts its calls in an attribute: its key changes at every call."""

    rowwise = True

    def __init__(self):
        self.calls = 0

    def forward(self, x, ctx):
        self.calls += 1
        return Done(x * 2)


def test_a_node_cached_per_example_that_changes_itself_warns_as_one_cached_whole_does():
    g = Graph.somatize(Counting().with_id("enc"))
    g.cache("enc", per="example")
    st.module(g)
    with pytest.warns(UserWarning, match=r"node 'enc' \(Counting\) is cached but changed its own"):
        g.forward(torch.ones(2, 3))


class Truncating(Node):
    """Cuts its output to the longest sequence of the batch: a row's shape depends on the
    other rows, so it is not row-wise, though each row's values are."""

    def __init__(self):
        self.emb = nn.Embedding(10, 4)

    def forward(self, b, ctx):
        longest = int(b["mask"].sum(1).max())
        return Done(Opaque(self.emb(b["ids"][:, :longest])))


def test_an_output_whose_row_shape_depends_on_the_batch_is_named_not_an_index_copy_error():
    g = Graph.somatize(Truncating().with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    ids = torch.randint(1, 10, (3, 6))
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    g.forward({"ids": ids[:2], "mask": mask[:2]})  # rows 0 and 1 stored as (3, 4)
    with pytest.raises(CacheError) as e:
        g.forward({"ids": ids, "mask": mask})  # row 2 computed as (5, 4) beside them
    message = str(e.value)
    assert "node 'enc'" in message and "(3, 4)" in message and "(5, 4)" in message
    assert "depend on that row alone" in message and "g.cache('enc')" in message


class Fields(Node):
    def __init__(self):
        self.emb = nn.Embedding(10, 4)

    def forward(self, b, ctx):
        return Done(Opaque(self.emb(b["input_ids"]).sum(1)))


def test_a_batch_with_fields_that_are_not_tensors_is_told_to_keep_them_out_of_the_node():
    g = Graph.somatize(Fields().with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    batch = {"input_ids": torch.randint(0, 10, (4, 5)), "text": ["a", "b", "c", "d"]}
    with pytest.raises(CacheError) as e:
        g.forward(batch)
    message = str(e.value)
    assert "node 'enc'" in message and "'text' is a list" in message
    assert "give the node only its tensors" in message and "split=" in message
    assert "Pick('input_ids') >> node" in message  # (the fields it may keep, by name)
    assert ".mapped()" not in message  # the batch is tensors and extras, not a list of items


def test_an_ndarray_is_named_with_an_and_the_from_numpy_fix():
    g = Graph.somatize(Fields().with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    ids = torch.randint(0, 10, (4, 5))
    with pytest.raises(CacheError, match=r"item 'input_ids' is an ndarray.*torch\.from_numpy"):
        g.forward({"input_ids": ids.numpy()})


class Pooled(Node):
    """A text encoder returning its pooled rows beside something that is not rows."""

    def __init__(self, extra):
        self.emb = nn.Embedding(10, 4)
        self.extra = extra

    def forward(self, ids, ctx):
        h = self.emb(ids).sum(1)
        if self.extra == "nested":
            return Done(Opaque({"pooled": h, "layers": {"last": h}}))
        return Done(Opaque((h, None)))  # (pooled, hidden states not asked for)


@pytest.mark.parametrize("extra", ["none", "nested"])
def test_an_output_that_is_not_rows_is_told_a_fix_for_the_output_not_for_the_input(extra):
    g = Graph.somatize(Pooled(extra).with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    with pytest.raises(CacheError) as e:
        g.forward(torch.randint(0, 10, (4, 5)))
    message = str(e.value)
    assert "node 'enc'" in message and "its output is" in message
    assert "split=" not in message and "collate_fn" not in message  # (input fixes)
    assert "batch of numbers" not in message
    if extra == "none":
        assert "item 1 is None;" in message and "return only its tensors" in message
    else:
        assert "item 'layers' is a dict" in message and "flatten it" in message


def test_a_nested_input_batch_is_told_to_flatten_not_to_use_mapped():
    g = Graph.somatize(Fields().with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    ids = torch.randint(0, 10, (4, 5))
    with pytest.raises(CacheError) as e:
        g.forward({"text": {"input_ids": ids, "attention_mask": ids > 0}})
    message = str(e.value)
    assert "item 'text' is a dict" in message and "flatten it" in message
    assert ".mapped()" not in message


class Scales(Node):
    """Normalises its input in place: on a hit it does not run, so the input stays unscaled."""

    def __init__(self):
        self.lin = nn.Linear(4, 4)

    def forward(self, x, ctx):
        x.div_(2)
        return Done(Opaque(self.lin(x)))


class Passes(Node):
    def forward(self, x, ctx):
        return Done(x)


class Adds(Node):
    def forward(self, pair, ctx):
        return Done(Opaque(pair[0] + pair[1]))


def test_a_node_cached_per_example_that_writes_its_input_in_place_warns_naming_it():
    g = Graph()
    g.node("enc", Scales()).node("raw", Passes()).node("add", Adds())
    g.edge("enc", "add").edge("raw", "add")  # the input, read by enc and (after it) raw
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    x = torch.arange(8.0).reshape(2, 4)
    with pytest.warns(UserWarning) as caught:
        g.forward(x.clone())
    said = [str(w.message) for w in caught if "in place" in str(w.message)]
    assert len(said) == 1 and "node 'enc' (Scales)" in said[0]
    assert "x = x / 2" in said[0] or "out of place" in said[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.forward(x.clone())  # once per node


def test_a_node_cached_per_example_that_leaves_its_input_alone_does_not_warn():
    g = Graph.somatize(Returns("tensor").with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.forward(torch.randn(3, 2))
        g.forward(torch.randn(3, 2))


class Tagged(torch.Tensor):
    """A tensor subclass (torchvision's tv_tensors are such)."""


class ReturnsTagged(Node):
    def __init__(self):
        self.lin = nn.Linear(2, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x).as_subclass(Tagged)))


def test_a_tensor_subclass_output_names_the_node_and_no_opaque_fix():
    g = Graph.somatize(ReturnsTagged().with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    with pytest.raises(TypeError) as e:  # (a ValueConversionError, as for an input)
        g.forward(torch.randn(3, 2))
    message = str(e.value)
    assert message.startswith("node 'enc' is cached per example, so its output is stored")
    assert "subclass Tagged" in message and "as_subclass(torch.Tensor)" in message
    assert "Opaque" not in message and message.endswith("or stop caching it")


def test_a_tensor_subclass_output_of_a_node_cached_whole_names_the_node_and_no_opaque_fix():
    g = Graph.somatize(ReturnsTagged().with_id("enc"))
    g.freeze("enc").cache("enc")
    model = st.module(g)
    with pytest.raises(ValueConversionError) as caught:
        model(torch.randn(3, 2))
    said = str(caught.value)
    assert said.startswith("node 'enc' is cached or named, so its output is stored as data, but ")
    assert "the torch.Tensor subclass Tagged" in said and said.endswith("or stop caching it")
    assert "Opaque" not in said


class Sequences(Node):
    """A text encoder given, or returning, one tensor per example (no batch dimension)."""

    def __init__(self, returns: str):
        self.emb = nn.Embedding(10, 4)
        self.returns = returns

    def forward(self, x, ctx):
        if self.returns == "nested":
            return Done(Opaque(torch.nested.as_nested_tensor(list(self.emb(x)))))
        if self.returns == "list":  # one (seq, dim) tensor per example
            return Done(Opaque(list(self.emb(x))))
        return Done(Opaque(torch.stack([self.emb(s).mean(0) for s in x])))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")
def test_a_nested_tensor_output_names_the_node_and_the_padding_fix():
    g = Graph.somatize(Sequences("nested").with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    with pytest.raises(CacheError, match=r"'enc'.*nested tensor.*to_padded_tensor"):
        g.forward(torch.randint(0, 10, (3, 5)))  # (before: torch's 'Internal error')


def test_a_list_of_sequences_is_told_to_pad_them_not_only_that_rows_differ():
    g = Graph.somatize(Sequences("pooled").with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    ids = [torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6, 7, 8, 9])]
    with pytest.raises(CacheError) as e:
        g.forward(ids)
    message = str(e.value)
    assert "'enc'" in message and "[2, 3, 4]" in message
    assert "a list of 3 tensors, one per example?" in message and "pad_sequence" in message
    with pytest.raises(CacheError) as fields:  # ids beside a mask: fields, told as before
        g.forward((torch.zeros(4, 5, dtype=torch.long), torch.ones(3, 5, dtype=torch.bool)))
    assert "one per example?" not in str(fields.value)


def test_a_list_of_one_output_per_example_is_told_to_stack_them():
    g = Graph.somatize(Sequences("list").with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    with pytest.raises(CacheError) as e:
        g.forward(torch.randint(0, 10, (3, 5)))  # a list of 3 (5, 4) tensors: 5 "rows"
    message = str(e.value)
    assert "returned 5 rows for 3 input rows" in message
    assert "a list of 3 tensors, one per example?" in message and "torch.stack" in message


class Conv(Node):
    """A conv backbone; torch also takes one unbatched (channels, h, w) image."""

    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


def test_one_example_without_its_batch_dimension_is_told_to_add_it():
    g = Graph.somatize(Conv().with_id("enc"))
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    image = torch.randn(3, 6, 6)
    with pytest.raises(CacheError) as e:
        g.forward(image)  # its 3 channels read as rows: 4 rows out of conv2d + Flatten
    message = str(e.value)
    assert "returned 4 rows for 3 input rows" in message and "'enc'" in message
    assert "one example without its batch dimension" in message and "x.unsqueeze(0)" in message
    assert g.forward(image.unsqueeze(0)).shape == (1, 64)  # the fix it names works
    both = Graph.somatize(Both().with_id("enc"))
    both.freeze("enc").cache("enc", per="example")
    st.module(both)
    with pytest.raises(CacheError) as fields:  # a tuple batch: fields, not one example
        both.forward((torch.randn(3, 2), torch.randn(3, 2)))
    assert "returned 6 rows for 3 input rows" in str(fields.value)
    assert "unsqueeze" not in str(fields.value)


class Both(Node):
    """Two fields' rows one after the other: twice the rows it was given."""

    def forward(self, x, ctx):
        return Done(torch.cat(x))
