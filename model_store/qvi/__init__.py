"""QVI model zoo: attention layers with query-value interaction, the architectures of the
paper built from them, the reference tokenizer, and the exporter of serving artifacts."""

__version__ = "0.1.0"
