"""Demo corpora: where each comes from and how it is built (see model_store/README.md)."""
