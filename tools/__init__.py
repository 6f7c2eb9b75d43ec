"""The oopscope command line and the tools around the pipeline (generator, benchmarks, NetFlow export)."""
