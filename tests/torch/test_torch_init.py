import somatize.torch


def test_public_surface_is_sorted_and_exact():
    assert somatize.torch.__all__ == sorted(somatize.torch.__all__)
    assert somatize.torch.__all__ == [
        "GraphModule",
        "NdarrayCodec",
        "TensorCodec",
        "load_state",
        "module",
        "parameters",
        "state",
    ]
    for name in somatize.torch.__all__:
        assert hasattr(somatize.torch, name), name
