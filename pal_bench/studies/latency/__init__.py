"""The buffer suites (``make bench``: ``suites/`` run by ``pal_bench.bench.run``): their tables (``tables``),
figures (``figures``) and publication (``publish``)."""
