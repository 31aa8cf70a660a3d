"""Traces that open where JAX users look: the Chrome trace event JSON that Perfetto reads, and
the kit's marks and batch spans inside a jax.profiler capture."""

import gzip
import json

import jax
import numpy as np
import pytest

from helpers import datasets, memory, perfetto, transfers
from helpers.errors import BadInputError


def _traced():
    with memory.track(interval=0.01, devices="cpu") as trace, transfers.trace() as log:
        kept = jax.device_put(np.ones(250_000, np.float32), jax.devices()[1]).block_until_ready()
        trace.mark("made")
        jax.jit(lambda v: v * 2)(np.ones(5, np.float32)).block_until_ready()  # an implicit copy
        del kept
    return trace, log


def test_the_export_is_trace_event_json_with_counters_marks_and_copies(tmp_path):
    trace, log = _traced()
    doc = perfetto.events(trace, log)
    assert doc["displayTimeUnit"] == "ms" and json.loads(json.dumps(doc)) == doc
    evs = doc["traceEvents"]
    assert {e["ph"] for e in evs} == {"M", "C", "i"}
    assert all(e["ts"] >= 0 and isinstance(e["ts"], float) for e in evs if e["ph"] != "M")
    counters = [e for e in evs if e["ph"] == "C" and e["name"].startswith("cpu:1")]
    assert max(e["args"]["bytes in use"] for e in counters) - counters[0]["args"][
        "bytes in use"] == 1_000_000  # the array, at the mark's own sample
    (mark,) = [e for e in evs if e["ph"] == "i" and e["name"] == "made"]
    copies = [e for e in evs if e["ph"] == "i" and e["pid"] == 3]
    assert any(c["args"]["bytes"] == 20 and c["name"] == "host->device implicit" for c in copies)
    late = max(c["ts"] for c in copies)
    assert late > mark["ts"]  # the jitted call's copy came after the mark: one clock for both
    names = {e["args"]["name"] for e in evs if e["ph"] == "M"}
    assert names == {"device memory (helpers.memory.track)", "host memory (helpers.memory.track)",
                     "transfers (helpers.transfers.trace)"}
    for name in ("t.json", "t.json.gz"):
        path = perfetto.save(tmp_path / name, trace, log)
        opened = gzip.open(path, "rt") if name.endswith(".gz") else open(path)
        with opened as f:
            assert json.load(f) == doc


def test_each_record_exports_alone_and_bad_input_is_named():
    trace, log = _traced()
    assert all(e["pid"] in (1, 2) for e in perfetto.events(memory=trace)["traceEvents"])
    assert all(e["pid"] == 3 for e in perfetto.events(transfers=log)["traceEvents"])
    assert perfetto.events(memory=trace.to_dict()) == perfetto.events(memory=trace)
    with pytest.raises(BadInputError, match="MemoryTrace"):
        perfetto.events(memory=42)


def test_marks_and_batch_spans_appear_inside_a_jax_profiler_capture(tmp_path):
    tokens = np.arange(100_000, dtype=np.uint16)
    with jax.profiler.trace(str(tmp_path)):
        with memory.track(interval=60) as trace:
            trace.mark("inside the capture")
        with datasets.batches(tokens, 4, 16, steps=2, prefetch=0) as it:
            list(it)
    (xplane,) = tmp_path.rglob("*.xplane.pb")
    captured = xplane.read_bytes()
    assert b"helpers mark: inside the capture" in captured
    assert b"helpers.batches: gather" in captured and b"helpers.batches: transfer" in captured
