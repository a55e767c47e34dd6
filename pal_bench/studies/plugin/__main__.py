import sys

from pal_bench.studies.plugin.measure import main

sys.exit(main())
