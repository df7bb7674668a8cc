import sys

from dtrain_lab.bench.cli import main

sys.exit(main())
