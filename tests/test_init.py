import somatize


def test_public_surface_is_sorted_and_exact():
    assert somatize.__all__ == sorted(somatize.__all__)
    assert somatize.__all__ == [
        "CacheError",
        "Catalog",
        "Codec",
        "Ctx",
        "CycleError",
        "DataCodec",
        "DeclarationError",
        "DiskKeeper",
        "Done",
        "DuplicateNodeError",
        "EmptyGraphError",
        "Graph",
        "GraphError",
        "JsonLines",
        "Keeper",
        "Mapped",
        "Memory",
        "MemoryKeeper",
        "MissingNodeError",
        "Node",
        "NodeError",
        "Opaque",
        "Placement",
        "Plan",
        "Recorder",
        "Run",
        "SomatizeError",
        "Step",
        "Topology",
        "Transport",
        "TransportError",
        "ValueConversionError",
        "Watcher",
        "decode",
        "digest",
        "encode",
        "key",
    ]
    for name in somatize.__all__:
        assert hasattr(somatize, name), name
