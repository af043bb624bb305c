"""Use cases: each wires pure planning to the effects it needs, grouped by what the user asks for.

``wheels/`` (the locked wheels: index, cache, folders, the wheel-build stage), ``locks/`` (locking a cell),
``builds/`` (building and self-testing an image), ``publishing/`` (the push, tags, signatures, the release index and
page), ``pods/`` (a pod's life); beside them what every use case shares: ``inputs`` (the matrix file and the compat
data, read), ``ports`` (the engine and registry a use case is given), ``progress`` and ``ci_setup``.
"""
