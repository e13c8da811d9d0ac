import sys

from rlmlab.cli import main

sys.exit(main())
