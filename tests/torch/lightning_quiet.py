"""Lightning's warnings that every test fit meets, whatever the module does: the
``pytestmark`` of the Lightning test files."""

import pytest

QUIET = [
    # lightning 2.6's CombinedLoader uses torch.utils._pytree.LeafSpec, deprecated in the
    # torch we run (2.13): every fit warns
    pytest.mark.filterwarnings(
        r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"
    ),
    # the tests' DataLoaders have num_workers=0 on purpose (tiny in-memory tensors);
    # Lightning advises more workers on machines with more than two cores
    pytest.mark.filterwarnings("ignore:The '.*' does not have many workers"),
]
NO_VAL = pytest.mark.filterwarnings(
    "ignore:You defined a `validation_step` but have no `val_dataloader`"
)
