"""`python -m resnet50_trainer.tools.plot`: the resnet50-plot command."""

from __future__ import annotations

import sys

from resnet50_trainer.tools.plot.command import main

sys.exit(main())
