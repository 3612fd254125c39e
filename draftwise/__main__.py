import sys

from draftwise.apps.cli import main

sys.exit(main())
