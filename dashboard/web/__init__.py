"""The Dash app: layout, figures, thin callbacks."""
