"""Keys of small values: a small dict, and a 256-float tensor (one item of a mapped batch).

* ``digest`` of a small dict against raw blake3 of a short string, and against the floor
  of a key: blake3 of the dict's encoding, already made.
* ``digest`` of a 256-float tensor through the tensor codec (what a cached mapped node
  computes per item) against raw blake3 of the same 1 KiB, from a view made beforehand,
  and against keyed blake3 of those bytes under a key made beforehand (the key's floor:
  ``somatize/torch/tensor_keys.py``).
"""

from __future__ import annotations

from common import Row, cpu_ratio, interleave, per_call

from somatize import digest
from somatize.values import encode


def run(quick: bool) -> list[Row]:
    import torch
    from blake3 import blake3

    from somatize.torch.codecs import default_codecs
    from somatize.torch.tensor_keys import layout_key

    torch.set_num_threads(1)
    small = {"ids": [101, 2023, 2003, 102], "lang": "en", "weight": 0.5}
    encoded = encode(small)
    codecs = default_codecs()
    item = torch.randn(256, generator=torch.Generator().manual_seed(0))
    raw = memoryview(item.numpy()).cast("B")
    layout = layout_key(item.dtype, tuple(item.shape))  # what its key is hashed under
    number = 20_000 if quick else 100_000
    t = interleave(
        {
            "dict": per_call(lambda: digest(small), number),
            "dict floor": per_call(lambda: blake3(encoded).hexdigest(), number),
            "tensor": per_call(lambda: digest(item, codecs), number),
            "tensor raw": per_call(lambda: blake3(raw).hexdigest(), number),
            "tensor keyed": per_call(lambda: blake3(raw, key=layout).hexdigest(), number),
        },
        trials=5 if quick else 9,
    )
    us = {k: v.median * 1e6 for k, v in t.items()}
    return [
        Row(
            "keys",
            "key of a small dict (3 keys, a list of 4 ints)",
            us["dict"],
            "µs",
            baseline="blake3 of its encoding, made beforehand",
            baseline_value=us["dict floor"],
            ratio=us["dict"] / us["dict floor"],
            cpu_ratio=cpu_ratio(t["dict"], t["dict floor"]),
            target="≤ 3 µs",
            met=us["dict"] <= 3.0,
            spread=f"{t['dict'].min * 1e6:.2f} – {t['dict'].max * 1e6:.2f} µs",
        ),
        Row(
            "keys",
            "key of a 256-float tensor item — its floor, keyed blake3 of the 1 KiB under a "
            f"key made beforehand (one blake3 chunk, as raw): {us['tensor keyed']:.2f} µs; the "
            "rest: the five checks of the pointer road, its (dtype, shape) lookup and the "
            "bytes copied out through the data pointer (about 0.7 µs of CPU), digest's "
            "dispatch to the codec (about 0.3 µs) — a Python floor: the checks and the lookup "
            "alone are each about 0.1 µs of tensor attribute reads",
            us["tensor"],
            "µs",
            baseline="raw blake3 of its 1 KiB",
            baseline_value=us["tensor raw"],
            ratio=us["tensor"] / us["tensor raw"],
            cpu_ratio=cpu_ratio(t["tensor"], t["tensor raw"]),
            target="≤ 1.5× raw blake3",
            met=us["tensor"] / us["tensor raw"] <= 1.5,
            spread=f"{t['tensor'].min * 1e6:.2f} – {t['tensor'].max * 1e6:.2f} µs",
        ),
    ]
