"""``python -m dpgate`` runs the command line."""

import sys

from dpgate.cli import main

sys.exit(main())
