import sys

from lazybatch.cli import main

sys.exit(main())
