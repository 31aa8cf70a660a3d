"""The kit's infrastructure, which no learner calls: the one seam into JAX's internals
(:mod:`.jaxcompat`), the child-process runner and its protocol (:mod:`.child`), the record base
(:mod:`.records`) and the host-memory sampler (:mod:`.host_sampler`). Modules here import only
:mod:`helpers.errors`, :mod:`helpers.units` and each other."""
