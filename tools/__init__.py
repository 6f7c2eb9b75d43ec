"""The oopscope command line and what surrounds the pipeline: commands, the run, the traffic generator, the thesis experiments, the NetFlow exporter."""
