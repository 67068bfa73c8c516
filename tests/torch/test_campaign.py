"""Many runs: summarize and the torch process pool (federated rounds: test_federated_recipes.py)."""

import concurrent.futures
import math
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
import torch

import somatize.torch as st


def test_summarize_numbers_and_results():
    s = st.summarize([0.91, 0.95, 0.93], "val_acc")
    assert (s.n, s.best, s.mode) == (3, 1, "max")
    assert s.mean == pytest.approx(0.93)
    assert s.std == pytest.approx(0.02)
    assert (s.min, s.max) == (0.91, 0.95)
    results = [
        st.TrainResult(state={}, num_examples=1, steps=1, epochs=1, metrics=[{"val_loss": v}])
        for v in (0.5, 0.2, 0.7)
    ]
    s = st.summarize(results, "val_loss")
    assert s.mode == "min" and s.best == 1 and s.values == (0.5, 0.2, 0.7)
    text = str(s)
    assert "val_loss: 0.4667 ± 0.2517 over 3 runs (95% CI -0.1585 to 1.0918, min" in text
    assert "0.2000  <- best" in text
    with pytest.raises(KeyError, match="no metric 'val_acc'.*val_loss"):
        st.summarize(results, "val_acc")
    with pytest.raises(ValueError, match=r"no results .*list is empty; .*runs\.failed"):
        st.summarize([], "val_acc")
    with pytest.raises(ValueError, match=r"NaN in every run \(all 2\); .*learning rate"):
        st.summarize([float("nan")] * 2, "val_loss", nan="omit")
    with pytest.raises(ValueError, match=r"mode='up'\): mode is 'min' \(lower is better\), 'max'"):
        st.summarize([0.5, 0.7], "val_acc", mode="up")  # type: ignore[arg-type]


def test_summarize_of_the_training_loss_says_it_is_a_number_to_give():
    """Runs trained without val= have no evaluated metric; the training loss and a loss's
    terms are in the result, summarised as numbers."""
    runs = [
        st.TrainResult(
            state={},
            num_examples=1,
            steps=2,
            epochs=1,
            losses=[0.9, v],
            epoch_losses=[v],
            terms={"kl": [0.1, 0.2]},
            epoch_terms={"kl": [0.15]},
        )
        for v in (0.5, 0.3)
    ]
    for name in ("loss", "train_loss"):
        with pytest.raises(
            KeyError, match=r"evaluated metrics: none; the training loss is no "
        ) as e:
            st.summarize(runs, name)
        assert f"st.summarize([r.epoch_losses[-1] for r in results], {name!r})" in str(e.value)
    s = st.summarize([r.epoch_losses[-1] for r in runs], "loss")
    assert (s.mean, s.best) == (pytest.approx(0.4), 1)
    with pytest.raises(KeyError, match=r"a loss term: \[r.epoch_terms\['kl'\]\[-1\] for r in "):
        st.summarize(runs, "kl")
    with pytest.raises(KeyError, match=r"none \(pass val= data and metrics= to the Trainer\)"):
        st.summarize(runs, "val_acc")


def test_run_all_given_no_list_of_items_says_what_items_are():
    with pytest.raises(TypeError, match=r"items holds one entry per run .*not 42 \(int\)"):
        st.run_all(concurrent.futures.ThreadPoolExecutor(1), print, 42)


def test_summarize_reads_which_way_a_metric_improves_from_its_name():
    values = [0.5, 0.2, 0.7]
    errors = ("val_mse", "val/ppl", "val_head_mae", "val_nll")
    terms = ("val_recon", "val_kl", "val_ce", "val_box_l1")  # a loss's terms (loss_terms.py)
    for name in errors + terms:  # errors and parts of a loss: lowest is best
        assert st.summarize(values, name).best == 1, name
    assert st.summarize(values, "val_cancer_acc").best == 2  # ("cer" only as a word)
    assert st.summarize(values, "val_recall").best == 2  # ("recon", "ce" only as words)
    with pytest.warns(UserWarning, match=r"summarize\('val_score'\).*mode='min'") as w:
        assert st.summarize(values, "val_score").best == 2
    assert w[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert st.summarize(values, "val_score", mode="min").best == 1  # said: no warning


def test_summarize_one_run_has_zero_std():
    one = st.summarize([0.5], "val_acc")
    assert one.std == 0.0
    assert "over 1 run (" in str(one)  # (not "1 runs")
    assert "over 2 runs (" in str(st.summarize([0.5, 0.7], "val_acc"))


def _worker_report(_):
    return os.getpid(), torch.get_num_threads()


def test_executor_workers_have_one_torch_thread_each_in_other_processes():
    with st.executor(workers=2) as pool:
        reports = list(pool.map(_worker_report, range(6)))
    pids = {pid for pid, _ in reports}
    assert os.getpid() not in pids
    assert {threads for _, threads in reports} == {1}


def test_executor_ships_lambdas_and_closures_with_cloudpickle():
    offset = 10
    with st.executor(workers=1) as pool:
        assert list(pool.map(lambda x: x + offset, [1, 2])) == [11, 12]


def test_classes_defined_in_main_train_on_the_pool(tmp_path):
    script = tmp_path / "campaign_main.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            import somatize.torch as st
            from somatize import Graph, Node, Done, Opaque

            class Line(Node):  # defined in __main__: only cloudpickle can ship it
                def __init__(self):
                    self.lin = nn.Linear(2, 1)
                def forward(self, x, ctx):
                    return Done(Opaque(self.lin(x)))

            def run(seed):
                torch.manual_seed(seed)
                g = Graph.somatize(Line())
                data = [(torch.randn(8, 2), torch.randn(8, 1)) for _ in range(3)]
                trainer = st.Trainer(loss=nn.functional.mse_loss,
                                     optimizer=lambda p: torch.optim.SGD(p, lr=0.1), seed=seed)
                return trainer.fit(g, data)

            if __name__ == "__main__":
                torch.set_num_threads(1)
                with st.executor(workers=2) as pool:
                    remote = list(pool.map(run, [0, 1]))
                    method = pool.start_method
                local = [run(0), run(1)]
                same = all(torch.equal(a.state[k], b.state[k])
                           for a, b in zip(remote, local) for k in a.state)
                print("SAME" if same else "DIFFERENT", remote[0].steps, method)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    # a plain script on Linux (one thread, no CUDA) forks its workers: they start at once
    expected = "fork" if sys.platform.startswith("linux") else "forkserver"
    assert out.stdout.split() == ["SAME", "3", expected]


def _pid(_):
    return os.getpid()


def test_the_start_method_is_fork_only_while_forking_is_safe(monkeypatch):
    from somatize.torch import campaign

    if not sys.platform.startswith("linux"):
        pytest.skip("fork is chosen on Linux only")
    monkeypatch.setattr(threading, "active_count", lambda: 1)  # whatever earlier tests left
    assert campaign._fork_unsafe() is None and campaign._pick_start_method() == "fork"
    # more than one torch thread per worker: OpenMP in a forked child can hang
    assert "threads_per_worker=2" in campaign._fork_unsafe(2)
    assert st.executor(workers=1, threads_per_worker=2).start_method == "forkserver"
    # CUDA initialized here: a forked worker could not use it
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert "CUDA is initialized" in campaign._fork_unsafe()
    assert campaign._pick_start_method() == "forkserver"
    with pytest.raises(ValueError, match="start_method='fork' with CUDA initialized.*forkserver"):
        st.executor(workers=1, start_method="fork")
    monkeypatch.undo()
    # another Python thread (it could hold a lock the child would inherit, held forever)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="busy-thread")
    other.start()
    try:
        assert "busy-thread" in campaign._fork_unsafe()
        assert campaign._pick_start_method() == "forkserver"
    finally:
        stop.set()
        other.join()
    with pytest.raises(ValueError, match="start_method='nope'"):
        st.executor(workers=1, start_method="nope")


@pytest.mark.slow
def test_a_cuda_initialized_parent_falls_back_to_forkserver_workers_that_run(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with st.executor(workers=2) as pool:
        assert pool.start_method == "forkserver"
        pids = set(pool.map(_pid, range(4)))
        assert pool.start_method == "forkserver"
    assert pids and os.getpid() not in pids


@pytest.mark.slow
def test_a_pool_made_while_fork_was_safe_starts_by_forkserver_once_it_is_not(monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("fork is chosen on Linux only")
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    pool = st.executor(workers=1)
    assert pool.start_method == "fork"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # CUDA came up since
    with pool:
        assert pool.submit(_pid, 0).result() != os.getpid()
        assert pool.start_method == "forkserver"
    with st.executor(workers=1, start_method="spawn") as pool:  # said explicitly: kept
        assert pool.submit(_pid, 0).result() != os.getpid()
        assert pool.start_method == "spawn"


def _modules_a_first_run_imports(_):
    from torch import nn

    from somatize import Done, Graph, Node, Opaque

    before = set(sys.modules)

    class Dense(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(4, 2)

        def forward(self, x, ctx):
            return Done(Opaque(self.lin(x)))

    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(2)]
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps),
        epochs=1,
        options=st.Options(progress=False),
    )
    trainer.fit(Graph.somatize(Dense()), data)
    return sorted(set(sys.modules) - before)


@pytest.mark.slow
def test_a_workers_first_run_imports_almost_nothing():
    """The forkserver preloads what a first optimizer step imports (torch._dynamo: ~800
    modules before), so a fresh worker's first run is as cheap as its later ones."""
    with st.executor(workers=1) as pool:
        new = pool.submit(_modules_a_first_run_imports, 0).result()
    assert not any(m.startswith(("torch._dynamo", "sympy")) for m in new), new
    assert len(new) <= 10, new


def test_summarize_names_a_failed_run_and_the_runs_of_run_all():
    runs = st.Runs([0.9, None, 0.8], {}, {1: ValueError("diverged")})
    with pytest.raises(ValueError, match=r"results\[1\] is None.*runs\.finished"):
        st.summarize(runs.results, "val_acc")
    with pytest.raises(TypeError, match=r"Runs.*runs\.finished"):
        st.summarize(runs, "val_acc")
    with pytest.raises(TypeError, match=r"results\[0\] is a dict.*TrainResult"):
        st.summarize([{"val_acc": 0.9}], "val_acc")
    assert st.summarize(runs.finished, "val_acc").n == 2


def _draws_when_both_workers_run(folder):
    """A worker's first draws from torch's and numpy's global generators, once both
    workers hold a call (each call waits for the other's file)."""
    import time

    import numpy as np

    draws = (os.getpid(), torch.randn(1).item(), float(np.random.rand()))
    with open(os.path.join(folder, str(os.getpid())), "w"):
        pass
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return draws


def test_workers_do_not_share_the_global_generators_they_inherited(tmp_path):
    import numpy as np

    torch.manual_seed(0)
    np.random.seed(0)  # what a forked worker would otherwise start from, every one of them
    with st.executor(workers=2) as pool:
        draws = list(pool.map(_draws_when_both_workers_run, [str(tmp_path)] * 2))
    assert len({pid for pid, _, _ in draws}) == 2, draws
    (_, torch_a, np_a), (_, torch_b, np_b) = draws
    assert torch_a != torch_b and np_a != np_b, draws
    torch.manual_seed(0)
    assert torch.randn(1).item() not in (torch_a, torch_b)  # not this process's sequence


def test_a_summary_s_confidence_interval_is_student_s_t_over_its_runs():
    stats = pytest.importorskip("scipy.stats")
    values = [0.97, 0.975, 0.968, 0.972, 0.98, float("nan")]  # a diverged run: left out
    s = st.summarize(values, "test_f1", nan="omit")
    kept = values[:5]
    want = stats.t.interval(0.95, 4, loc=sum(kept) / 5, scale=stats.sem(kept))
    assert s.ci == (pytest.approx(want[0], abs=1e-12), pytest.approx(want[1], abs=1e-12))
    assert f"(95% CI {want[0]:.4f} to {want[1]:.4f}, min 0.9680" in str(s)
    one = st.summarize([0.97], "test_f1")
    assert math.isnan(one.ci[0]) and "CI" not in str(one)  # one run: no spread to judge by
    assert str(one).splitlines()[-1] == "test_f1: 0.9700 over 1 run (min 0.9700, max 0.9700)"
