import sys

from kvarena.cli import main

sys.exit(main())
