"""Pure analyses: frames in, results out. No I/O, no printing, no Dash."""
from .. import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)
