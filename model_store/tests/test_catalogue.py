"""The Python side of the output catalogue against the C++ table (server/core/outputs/outputs.cc): every
model output the zoo can return has the symbolic shape the server's catalogue row gives it (the server
checks each output of a loaded model against that row), and every catalogue row with a model tensor is
an output the zoo knows. A row added on one side only fails here."""
import os
import re

from conftest import REPO
from qvi import models

ROW = re.compile(r'\{Output::k\w+,\s+"(?P<name>\w+)",\s+K::\w+,\s+S::\w+,\s+F::\w+,\s+(?:"(?P<shape>[A-Z,]+)"|nullptr)')


def catalogue_shapes():
    with open(os.path.join(REPO, "server", "core", "outputs", "outputs.cc"), encoding="utf-8") as f:
        text = f.read()
    rows = {m["name"]: m["shape"] for m in ROW.finditer(text)}
    assert len(rows) >= 20, f"the catalogue's rows were not found in outputs.cc ({len(rows)})"
    return {name: shape.split(",") for name, shape in rows.items() if shape}


def test_every_model_output_has_the_catalogues_shape():
    cpp = catalogue_shapes()
    assert models._SHAPES == cpp, (
        f"only in models.py: {sorted(set(models._SHAPES) - set(cpp))}; only in outputs.cc: "
        f"{sorted(set(cpp) - set(models._SHAPES))}; different: "
        f"{sorted(n for n in set(cpp) & set(models._SHAPES) if cpp[n] != models._SHAPES[n])}")


def test_the_zoos_models_return_only_catalogued_outputs():
    """Each architecture's eval-mode outputs, as output_spec (what the manifest records) reads them."""
    cpp = catalogue_shapes()
    seen = set()
    for arch in models.ARCHITECTURES:
        g = "none" if arch in models.BASELINES else "qvi"
        cfg = models.ModelConfig(arch, 20, 3, g=g, emb_dim=8, hidden=8, heads=2, ffn=16)
        for name, spec in models.output_spec(cfg).items():
            assert spec["shape"] == cpp[name], (arch, name)
            seen.add(name)
    assert {"logits", "emissions", "attention", "gates", "layer_attention", "lambda_q"} <= seen, seen
