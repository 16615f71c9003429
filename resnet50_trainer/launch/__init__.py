"""This machine's processes: the checks before any training process starts, and the start of
those processes (one per GPU or CPU worker) under our own launcher or another's."""
