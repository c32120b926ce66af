"""fedhier: hierarchical probabilistic models fitted across sites whose data may not move."""

__version__ = "0.1.0"
