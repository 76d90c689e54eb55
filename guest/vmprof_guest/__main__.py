import sys

from vmprof_guest.agent import main

sys.exit(main())
