import sys

from vmprof_tui.cli import main

sys.exit(main())
