"""map_clients gives a worker's clients tensors at 64-byte-aligned addresses, as torch's own
allocator does, so that a pooled round computes the same bits as a serial one (CPU GEMM
sums in another order on misaligned storage)."""

import concurrent.futures
import os
import pickle

import pytest
import torch

import somatize.torch as st
from somatize.torch import federated as fl
from somatize.torch.federated import spool as sp

needs_shm = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this host")


def client(w, task):
    """Where each input starts, mod 64, and a gradient through x @ w.t()."""
    pad, x = task
    offsets = (w.data_ptr() % 64, pad.data_ptr() % 64, x.data_ptr() % 64)
    w = w.clone().requires_grad_()
    return offsets, torch.autograd.grad((x @ w.t()).pow(2).sum(), w)[0]


@pytest.fixture
def one_thread():
    """The parent computes with one torch thread, as st.executor's workers do."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pool():
    with st.executor(workers=2) as p:
        yield p


def inputs():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 64, generator=g)
    # tensors of 4..24 bytes before each x: packed end to end, x would start misaligned
    tasks = [(torch.zeros(k), torch.rand(3, 64, generator=g)) for k in range(1, 7)]
    return w, tasks


def assert_same_as_serial(pool, **kwargs):
    w, tasks = inputs()
    serial = fl.map_clients(None, client, tasks, shared=w)
    pooled = fl.map_clients(pool, client, tasks, shared=w, **kwargs)
    for i, ((_, want), (offsets, got)) in enumerate(zip(serial, pooled)):
        assert offsets == (0, 0, 0), (i, offsets)
        assert torch.equal(got, want), i
        assert got.data_ptr() % 64 == 0, i  # the result, rebuilt here, too


@needs_shm
@pytest.mark.parametrize("batches", [None, 1, 2, 6])
def test_a_pooled_round_is_bit_identical_to_the_serial_one(pool, one_thread, batches):
    assert_same_as_serial(pool, batches=batches)


def test_in_band_tensors_are_aligned_too(one_thread):
    # a thread pool gets no spool: tasks, results and the shared value travel in-band
    with concurrent.futures.ThreadPoolExecutor(2) as threads:
        assert sp.open_spool(threads) is None
        assert_same_as_serial(threads, batches=3)


def test_every_rebuilt_tensor_starts_on_64_bytes(tmp_path):
    values = [torch.arange(k, dtype=torch.uint8) for k in range(1, 70)]
    values += [torch.ones(k, dtype=torch.float64) for k in range(1, 9)] + [torch.empty(0)]
    shipped = sp.ship(values, str(tmp_path))
    assert isinstance(shipped, tuple)  # through a spool file
    for how, back in [
        ("spool", sp.unship(shipped, str(tmp_path))),
        ("in-band", sp.unship(sp.ship(values, None), None)),
        ("dumps", pickle.loads(sp.dumps(values))),
    ]:
        assert [b.data_ptr() % 64 for b in back if b.numel()] == [0] * (len(values) - 1), how
        assert all(torch.equal(a, b) for a, b in zip(values, back)), how
    assert not os.listdir(tmp_path)


def test_the_spool_file_pads_between_buffers_not_after_the_last(tmp_path):
    path, head, sizes = sp.ship([torch.ones(1, dtype=torch.uint8), torch.ones(3)], str(tmp_path))
    assert sizes == [1, 12]
    assert os.path.getsize(path) == 64 + 12
    back = sp.unship((path, head, sizes), str(tmp_path))
    assert torch.equal(back[1], torch.ones(3))
