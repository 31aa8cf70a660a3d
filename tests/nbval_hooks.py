"""pytest plugin for the nbval run (`-p tests.nbval_hooks`): leave stderr out of comparisons.

XLA and absl write log lines to stderr that differ by machine; only cells marked
`# NBVAL_CHECK_OUTPUT` are compared at all (lax mode), and for those only stdout and results.
"""


def pytest_collectstart(collector):
    path = getattr(collector, "path", None)
    if path is not None and path.suffix == ".ipynb":
        collector.skip_compare += ("stderr",)
