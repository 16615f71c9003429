"""`python -m resnet50_trainer`: the same as the resnet50-trainer command."""

from __future__ import annotations

from resnet50_trainer.cli import command

command()
