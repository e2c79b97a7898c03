import sys

from cellplane_operator.commands.main import main

sys.exit(main())
