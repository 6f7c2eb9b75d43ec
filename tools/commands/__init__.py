"""One module per `oopscope` command; heavy imports stay inside the command bodies."""
