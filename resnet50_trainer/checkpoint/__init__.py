"""State on disk: atomic checkpoint files, the schema that validates a checkpoint, the entries
each stateful part owns, the saver, the lock, resume and auto-resume, initial weights."""
