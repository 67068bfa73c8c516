"""recipes/frozen_backbone.py: the sweep with the backbone cached agrees with the sweep without."""

from __future__ import annotations

import pytest

from recipes import frozen_backbone


@pytest.mark.slow
def test_the_recipe_computes_each_example_once_and_agrees_with_recomputing(tmp_path, capsys):
    args = ["--configs", "2", "--epochs", "2", "--pretrain-epochs", "3", "--target", "0.7",
            "--finetune-epochs", "1"]  # fmt: skip
    code = frozen_backbone.main([*args, "--cache", str(tmp_path)])
    out = capsys.readouterr().out
    assert "the backbone ran on 1797 rows" in out  # every train and val example, once
    assert code == 0, out  # both sweeps agree; the best head reaches 0.7 in 2 epochs
    assert "fine-tuned the best whole for 1 epochs" in out  # and fine-tuning lost nothing
    again = frozen_backbone.main([*args, "--cache", str(tmp_path)])  # the cache filled
    out = capsys.readouterr().out
    assert "the backbone ran on 0 rows" in out and again == 0, out  # (it exited 1 here)
