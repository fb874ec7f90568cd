import sys

from ctrkit.cli import main

sys.exit(main())
