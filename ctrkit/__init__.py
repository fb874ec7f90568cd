"""ctrkit: click-through-rate ranking models from raw logs to a served model."""

__version__ = "0.1.0"
