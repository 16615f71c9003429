"""What a run reports: the CSV run log, the progress bar, the GPU monitor, the profiler."""
