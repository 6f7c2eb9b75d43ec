"""What surrounds one run of the pipeline: configuration, runner threads, feeds, replay, live links, outputs, progress."""
