"""The command line and its tools: ``audiobuffer run | config | demo`` (``cli``), the demo, the run
report, ``audiobuffer bench`` and ``audiobuffer stress``.

Nothing in the core imports this package; everything here may import the core.
"""
