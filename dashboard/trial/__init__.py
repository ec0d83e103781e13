"""Where a trial lives and how it is read."""
