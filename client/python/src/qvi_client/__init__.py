"""qvi-serve-client: the typed Python client of QVI Serve (see client.py)."""
from qvi_client.client import (Answer, Classification, Client, LabelScore, LayerMap, ModelState, QviError, Span,
                               Tagging, Token, VersionState)

__all__ = ["Answer", "Classification", "Client", "LabelScore", "LayerMap", "ModelState", "QviError", "Span", "Tagging",
           "Token", "VersionState"]
__version__ = "0.1.0"
