import sys

from cellplane_operator.cli import main

sys.exit(main())
