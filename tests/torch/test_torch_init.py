import somatize.torch

# The names this part of the surface provides. (The exact list of somatize.torch grows
# with the Trainer and level-3 functions; pin it where those branches meet.)
MODULE_SURFACE = {
    "GraphModule",
    "NdarrayCodec",
    "TensorCodec",
    "load_state",
    "module",
    "parameters",
    "state",
}


def test_public_surface_is_sorted_and_holds_the_module_names():
    assert somatize.torch.__all__ == sorted(somatize.torch.__all__)
    assert set(somatize.torch.__all__) >= MODULE_SURFACE
    for name in somatize.torch.__all__:
        assert hasattr(somatize.torch, name), name
