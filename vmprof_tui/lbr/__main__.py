import sys

from vmprof_tui.lbr.command import main

sys.exit(main())
