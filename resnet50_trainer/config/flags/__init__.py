"""The command line's flags, one file a group, each group's checks beside its flags."""
