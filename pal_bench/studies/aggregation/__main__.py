import sys

from pal_bench.studies.aggregation.measure import main

sys.exit(main())
