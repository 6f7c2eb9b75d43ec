"""Past one machine: capture agents that run the low level next to their links, a collector that runs the high level over their shared spool, and the work items an appliance gives its agents."""
