import sys

from pal_bench.studies.race import main

sys.exit(main())
