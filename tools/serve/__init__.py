"""The appliance: `oopscope serve` and the client commands that talk to it."""
