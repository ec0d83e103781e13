"""Pure analyses: frames in, results out. No I/O, no printing, no Dash."""
