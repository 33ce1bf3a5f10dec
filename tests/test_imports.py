"""What importing the library costs a user's process.

A producer's users pay for everything ``import pipeline`` loads twice: once in
start-up time, and again in every full pass of CPython's cyclic GC, which walks
every tracked object for the life of the process. Under a send() loop the GC
runs a full pass every ~100k messages (measured: 8 per 1M), so long-lived
objects the library drags in are a per-message cost.
"""

from __future__ import annotations

import json
import subprocess
import sys

# Run in a fresh interpreter: this test process has pytest (and more) loaded.
_PROBE = r"""
import gc, json, sys
import pipeline
from pipeline import open_producer, ProducerConfig, ProducerMessage, SyncProducer
import pipeline.consumer, pipeline.producer._api, pipeline.protocol.records
gc.collect()
big = []
for name, mod in sorted(sys.modules.items()):
    if name.split(".")[0] != "pipeline":
        continue
    for attr, value in vars(mod).items():
        if gc.is_tracked(value) and len(gc.get_referents(value)) > 1024:
            big.append(f"{name}.{attr}: {type(value).__name__} of {len(gc.get_referents(value))}")
print(json.dumps({"modules": sorted(sys.modules), "big": big}))
"""


def _probe() -> dict[str, list[str]]:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         check=True, timeout=60)
    result: dict[str, list[str]] = json.loads(out.stdout)
    return result


def test_importing_the_producer_does_not_import_test_tools() -> None:
    """trio.testing imports pytest and pygments (~9k long-lived objects): only the
    in-memory test transport needs it, and it imports it when used."""
    modules = _probe()["modules"]
    loaded = [m for m in modules if m.split(".")[0] in ("pytest", "_pytest", "pygments")
              or m.startswith("trio.testing") or m.startswith("pipeline.testing")]
    assert loaded == []


def test_no_large_gc_tracked_tables_at_module_level() -> None:
    """Lookup tables (the RecordBatch varint tables: 4 x 16,384 entries) are
    tuples of immutable items, which the GC stops tracking; as lists they were
    65k extra references walked by every full collection."""
    assert _probe()["big"] == []


def test_the_public_packages_export_what_they_list() -> None:
    """Every name of ``pipeline.__all__``, ``pipeline.producer.__all__`` and
    ``pipeline.consumer.__all__`` resolves (the lazy tables name real modules), and
    the producer's public names are the same objects as the top level's."""
    import pipeline
    import pipeline.consumer
    import pipeline.producer

    for package in (pipeline, pipeline.producer, pipeline.consumer):
        missing = [n for n in package.__all__ if getattr(package, n, None) is None]
        assert missing == [], f"{package.__name__} lists names it cannot give: {missing}"
    shared = set(pipeline.__all__) & set(pipeline.producer.__all__)
    assert shared and all(getattr(pipeline, n) is getattr(pipeline.producer, n) for n in shared)
