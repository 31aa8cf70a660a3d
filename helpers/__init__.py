"""JAX Device Kit: where did my array go, and why is my GPU out of memory?

One public module per question (the map: ``helpers/README.md``): ``devices`` (backends,
devices, where an array sits, who plays accelerator and host), ``settings`` (the environment
variables and their known mistakes), ``doctor`` (the report that never crashes), ``memory``
(bytes now and over time), ``transfers`` (the copies a block made), ``preflight`` (will a file or
a step fit), ``oom`` (the OOM reproduced), ``allocation`` and ``gpu`` (the GPU allocator and
driver), ``datasets``, ``feeding`` and ``loading`` (the token file), ``memory_profile``,
``render`` and ``plotting`` (text, HTML, figures), ``widgets``, ``units`` and ``errors`` (one
exception tree, ``KitError``). Infrastructure no learner calls lives in ``helpers._internal``.
Capture returns plain records; rendering is separate. The CLI is ``python -m helpers``.

Importing ``helpers`` does not start any JAX backend, so it is safe in a notebook's first cell
before ``jax.config.update("jax_num_cpu_devices", ...)``. In IPython or Jupyter,
``%load_ext helpers`` explains a cell's RESOURCE_EXHAUSTED and adds ``%%memory``
(:mod:`helpers.ipython`).
"""

__version__ = "0.1.0"

from helpers._internal import forks as _forks  # noqa: E402
from helpers._internal import jaxcompat as _jaxcompat  # noqa: E402

_forks.watch()  # each os.fork() after JAX started, by line (settings.check_process names it)
# the backend-start hook as soon as JAX is imported, by the user or a library (diffusers#1794)
_jaxcompat.hook_when_jax_imports()


def load_ipython_extension(ipython) -> None:
    """``%load_ext helpers``: see :mod:`helpers.ipython`."""
    from helpers import ipython as extension

    extension.load(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext helpers``."""
    from helpers import ipython as extension

    extension.unload(ipython)
