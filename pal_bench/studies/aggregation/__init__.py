"""Gradient aggregation schemes (``pal-bench aggregation``): ``measure`` times the schemes, ``publish`` holds
their tables and figures."""
