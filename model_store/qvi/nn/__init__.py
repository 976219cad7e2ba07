"""TorchScript-compatible layers. Every module takes a boolean padding mask (True = real token)
and guarantees that padded positions influence nothing at real positions."""

from qvi.nn.functional import masked_softmax, masked_mean, reverse_within_length
from qvi.nn.additive import SCORES, AdditiveAttention
from qvi.nn.self_attention import MultiHeadSelfAttention
from qvi.nn.encoders import MaskedConv1d, MaskedBiRNN, TransformerEncoder, sinusoidal_positions
from qvi.nn.crf import CRF

INTERACTIONS = ("none", "qvi", "g2", "g3")
"""How attention values are formed (paper §3 and the §4.3 ablations):
none = standard attention, values only (g1);  qvi = gated query-value interaction (eq. 4-5 / 8-9);
g2 = interactions only (Q * W V);  g3 = simple sum (Q * W V + V)."""


def check_interaction(g: str) -> str:
    if g == "g1":
        return "none"
    if g not in INTERACTIONS:
        raise ValueError(f"interaction must be one of {INTERACTIONS} (or g1), got {g!r}")
    return g
