"""`python -m engine <command>`: the alias of `python -m cli` (cli/__main__.py)."""
import sys

from cli.__main__ import main

sys.exit(main())
