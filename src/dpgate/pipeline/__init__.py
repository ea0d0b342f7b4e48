"""The query pipeline of the gateway (issue 20, "Compile once"), without HTTP or CLI.

``strategy`` (which release a plan gets), ``budget`` (the requested and resolved budget),
``runners`` (one per strategy: calibrate, check, charge, run), ``documents`` (release and
explain documents), ``admin`` (caps, populations, external charges) and ``gateway`` (the
:class:`~dpgate.pipeline.gateway.Gateway` facade). Layers: api | cli | ui → pipeline → the rest
(enforced by import-linter). Nothing is imported here: import the submodules.
"""
