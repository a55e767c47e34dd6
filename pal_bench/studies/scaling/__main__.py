import sys
import threading

from pal_bench.studies.scaling.measure import main

threading.current_thread().name = "main"
sys.exit(main())
