"""`python -m resnet50_trainer`: the same as the resnet50-trainer command."""

import sys

from resnet50_trainer.cli import main

sys.exit(main())
