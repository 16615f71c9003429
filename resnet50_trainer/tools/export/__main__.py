"""`python -m resnet50_trainer.tools.export`: the resnet50-export command."""

from __future__ import annotations

import sys

from resnet50_trainer.tools.export.command import main

sys.exit(main())
