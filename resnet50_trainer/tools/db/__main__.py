"""`python -m resnet50_trainer.tools.db`: the resnet50-db command."""

from __future__ import annotations

import sys

from resnet50_trainer.tools.db.command import main

sys.exit(main())
