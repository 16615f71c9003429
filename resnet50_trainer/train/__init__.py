"""One process's run: the epoch loop, its inputs, batch mixing, evaluation, evaluate-only, the
divergence watch and the count of bad records."""
