import sys

from partui.cli import main

sys.exit(main())
