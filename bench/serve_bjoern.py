"""Run one app from bench/apps.py under bjoern: serve_bjoern.py APP PORT."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bjoern  # noqa: E402

import apps  # noqa: E402

bjoern.run(getattr(apps, sys.argv[1]), "127.0.0.1", int(sys.argv[2]))
