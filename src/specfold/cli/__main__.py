"""``python -m specfold.cli ...``"""

import sys

from specfold.cli import main

sys.exit(main())
