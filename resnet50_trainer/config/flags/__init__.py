"""The command line's flags, one file a group, declarations only (config/checks.py checks the
settings)."""
