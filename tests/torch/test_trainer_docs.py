"""docs/trainer.md: every Python example runs, in order, in one namespace; its list of
``st.Options`` names every setting."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "trainer.md"


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def test_the_trainer_docs_examples_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the examples write under runs/
    code = blocks()
    assert len(code) >= 15
    page = types.ModuleType("docs_trainer")  # importable: torch.compile looks the code up
    monkeypatch.setitem(sys.modules, "docs_trainer", page)
    namespace: dict = page.__dict__
    ran = 0
    for block in code:
        needs = re.match(r"# requires: (\w+)", block)
        if needs and importlib.util.find_spec(needs.group(1)) is None:
            continue  # an optional package (optuna) that is not installed
        exec(compile(block, f"{DOC}:block{ran}", "exec"), namespace)
        ran += 1
    assert ran >= len(code) - 1
    out = capsys.readouterr()
    assert "TrainResult(30 steps, 3 epochs, 160 examples" in out.out
    assert "True 3" in out.out  # the Patience example stops where its comment says
    assert "True 5" in out.out  # ...and under Options(min_epochs=5), no earlier
    assert "'val_clean_acc', 'val_clean_loss', 'val_noisy_acc', 'val_noisy_loss']" in out.out
    assert "\n[1, 3]\n" in out.out  # eval_every_epochs=2 over 4 epochs
    assert "\n6 32\n" in out.out  # limit_train_batches=0.25: 2 batches of 16 an epoch
    assert "\n1 1 None\n" in out.out  # the smoke run: one step, one evaluation, no checkpoint
    assert "\n30 30\n" in out.out  # planned_steps: the steps the fit took
    assert "\nTrue 1\nFalse 30\n" in out.out  # max_time=1e-9: one step, and it is the last
    assert not (tmp_path / "runs" / "smoke").exists()
    assert "runs/example/ckpt/step-000000030.ckpt" in out.out
    assert "done: 20 steps" in out.err  # the progress line
    assert (tmp_path / "runs" / "example" / "run.jsonl").exists()
    assert any((tmp_path / "runs" / "example" / "tb").iterdir())
    assert (tmp_path / "runs" / "example" / "log.csv").read_text().startswith("kind,step,epoch")
    assert "{'val_loss': " in out.out  # evaluate's names, prefixed as fit's records
    # the training set's metrics: as a validation set, and a node's per step
    assert "'val_train_acc', 'val_train_loss', 'val_valid_acc', 'val_valid_loss']" in out.out
    assert "seconds,scored/acc,val_loss,val_scored/acc,epoch_loss,epoch_scored/acc\n" in out.out
    assert "['scored/acc'] 2\n" in out.out  # the node metric's epoch means
    assert "['epoch', 'step', 'val_loss', 'val_scored/acc']" in out.out
    assert "['step', 'epoch', 'val_loss', 'val_recon', 'val_kl']" in out.out  # loss terms
    assert "\n3 True\n" in out.out  # SWA: the 3rd, 4th and 5th epochs averaged
    header = (tmp_path / "runs" / "vae" / "log.csv").read_text().splitlines()[0]
    assert header == (
        "kind,step,epoch,loss,lr,examples,seconds,recon,kl,val_loss,val_recon,val_kl,"
        "epoch_loss,epoch_recon,epoch_kl"
    )


def test_the_ddp_script_is_a_whole_file(tmp_path, monkeypatch, capsys):
    """The `# train_ddp.py` example runs on its own, as torchrun would run it (before: a
    NameError, it used the page's earlier names)."""
    monkeypatch.chdir(tmp_path)
    (script,) = [b for b in blocks() if b.startswith("# train_ddp.py")]
    exec(compile(script, "train_ddp.py", "exec"), {"__name__": "__main__"})
    assert (tmp_path / "runs" / "ddp" / "ckpt" / "last").exists()
    assert 0.0 <= float(capsys.readouterr().out) <= 1.0  # the val_acc it prints


def test_the_list_of_options_names_every_field():
    import dataclasses

    import somatize.torch as st

    text = DOC.read_text()
    listed = text[text.index("settings live in `st.Options`") : text.index("The\nTrainer itself")]
    missing = [f.name for f in dataclasses.fields(st.Options) if f"`{f.name}`" not in listed]
    assert not missing  # (before: find_unused_parameters)
