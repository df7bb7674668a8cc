import sys

from dtrain_lab.i18n import main

sys.exit(main())
