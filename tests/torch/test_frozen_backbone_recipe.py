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


def test_the_recipe_counts_computed_rows_without_keeping_the_events():
    # (a Recorder kept every CacheRows, each holding its batch's keys: ~120 bytes a row an
    # epoch, growing through a long fit; a count keeps one int)
    from somatize.watchers import CacheRows, StepEnd

    counted = frozen_backbone.Computed()
    for misses in (64, 0, 12):
        counted.on_event(CacheRows("run", "enc", 0, 64 - misses, misses, ("0" * 64,) * 64))
        counted.on_event(StepEnd("run", 0, 0, 1.0, 0.1, 64, 0.01))
    assert counted.rows == 76 and vars(counted) == {"rows": 76}
