"""redrive: failed Kafka messages come back when due; spent ones land in dead letters."""

__version__ = "0.1.0"
