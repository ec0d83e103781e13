"""The Dash app: layout, figures, thin callbacks."""
from .. import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)
